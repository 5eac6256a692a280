// "SIGSEGV (Segmentation fault)": a signal's name and description, for messages about a child
// process that a signal ended.
#pragma once

#include <csignal>
#include <cstring>
#include <string>

namespace backhaul {

inline std::string signal_description(int signal) {
  const char* abbrev = ::sigabbrev_np(signal);
  const char* text = ::strsignal(signal);
  std::string name = abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(signal);
  return text ? name + " (" + text + ")" : name;
}

}  // namespace backhaul
