// Exception types used inside the host. They never cross the plugin ABI.
#pragma once

#include <stdexcept>
#include <string>

namespace backhaul {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class ConfigError : public Error {
 public:
  using Error::Error;
};

class PluginLoadError : public Error {
 public:
  using Error::Error;
};

class StorageError : public Error {
 public:
  using Error::Error;
};

}  // namespace backhaul
