# backhaul::warnings: the project's warning flags, linked PRIVATE by every target, never installed.
add_library(backhaul_warnings INTERFACE)
add_library(backhaul::warnings ALIAS backhaul_warnings)
target_compile_options(backhaul_warnings INTERFACE -Wall -Wextra -Wpedantic -Wshadow -Wcast-align
  -Wimplicit-fallthrough
  $<$<COMPILE_LANGUAGE:CXX>:-Wnon-virtual-dtor -Woverloaded-virtual>)
