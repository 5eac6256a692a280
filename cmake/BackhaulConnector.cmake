# backhaul_add_connector(<target> SOURCES <files...> [OUTPUT_NAME <name>] [OUTPUT_DIRECTORY <dir>])
#
# Builds a connector plugin as a MODULE that links only the SDK: hidden visibility, no "lib"
# prefix, and a version script so that backhaul_entry is the only exported symbol. -z defs proves
# at link time that the plugin needs nothing from the host (skipped under sanitizers, whose
# runtime symbols live in the executable).
function(backhaul_add_connector target)
  cmake_parse_arguments(ARG "" "OUTPUT_NAME;OUTPUT_DIRECTORY" "SOURCES" ${ARGN})
  add_library(${target} MODULE ${ARG_SOURCES})
  if(TARGET backhaul::sdk)
    target_link_libraries(${target} PRIVATE backhaul::sdk)
  else()
    target_link_libraries(${target} PRIVATE BackhaulSDK::sdk)
  endif()
  if(NOT ARG_OUTPUT_NAME)
    set(ARG_OUTPUT_NAME ${target})
  endif()
  set_target_properties(${target} PROPERTIES
    PREFIX ""
    OUTPUT_NAME "${ARG_OUTPUT_NAME}"
    C_VISIBILITY_PRESET hidden
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  if(ARG_OUTPUT_DIRECTORY)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY "${ARG_OUTPUT_DIRECTORY}")
  endif()
  set(_script "${CMAKE_CURRENT_BINARY_DIR}/${target}.exports.map")
  file(WRITE "${_script}" "{\n  global: backhaul_entry;\n  local: *;\n};\n")
  target_link_options(${target} PRIVATE "LINKER:--version-script=${_script}")
  string(FIND "${CMAKE_CXX_FLAGS} ${CMAKE_SHARED_LINKER_FLAGS}" "-fsanitize" _san)
  if(_san EQUAL -1 AND NOT BACKHAUL_SANITIZE)
    target_link_options(${target} PRIVATE "LINKER:-z,defs")
  endif()
endfunction()
