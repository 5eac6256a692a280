// Internal to core/plugins: a mapped, checked and initialized plugin library.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <boost/dll/shared_library.hpp>

#include "backhaul/backhaul.h"

#include "core/common/unique_fd.h"
#include "core/plugins/host_services.h"
#include "core/plugins/plugin.h"

namespace backhaul::plugins {

// The sealed copy of a library that plugins bring along (plugin_loader.cpp, OriginDependencies),
// shared by every plugin that uses it: open for as long as one of them is loaded, so that the
// name it is mapped under keeps leading to it.
struct BundledCopy {
  UniqueFd fd;
  std::string name;  // /proc/PID/fd/N: what dlopen() mapped it by
  std::filesystem::path path;
  std::string sha256;
};

// Destroyed only when nothing from the library lives any more (every Plugin, Connector and Page
// holds a shared_ptr to it): then deinit() runs and the library is unmapped, in that order.
class LoadedLibrary {
 public:
  LoadedLibrary(UniqueFd copy, std::vector<std::shared_ptr<const BundledCopy>> bundled,
                boost::dll::shared_library library, const backhaul_entry_t* entry, PluginInfo info,
                std::unique_ptr<HostBinding> host)
      : copy_(std::move(copy)),
        bundled_(std::move(bundled)),
        library_(std::move(library)),
        entry_(entry),
        info_(std::move(info)),
        host_(std::move(host)) {}
  LoadedLibrary(const LoadedLibrary&) = delete;
  LoadedLibrary& operator=(const LoadedLibrary&) = delete;
  // deinit() must not throw; one that does is logged (an exception cannot leave a destructor).
  ~LoadedLibrary();

  const backhaul_entry_t& entry() const noexcept { return *entry_; }
  const PluginInfo& info() const noexcept { return info_; }
  const HostBinding& host() const noexcept { return *host_; }
  void mark_initialized() noexcept { initialized_ = true; }

 private:
  // The sealed copy of the file that library_ is mapped from, open for as long as it is mapped:
  // its descriptor number names the library (/proc/PID/fd/N) for dlopen and for debuggers.
  UniqueFd copy_;
  // The libraries it brought along or shares, whose copies must stay open as long.
  std::vector<std::shared_ptr<const BundledCopy>> bundled_;
  // Destroyed after everything below: the code must stay mapped while deinit runs and until the
  // host binding (which the plugin may still reference) is gone.
  boost::dll::shared_library library_;
  const backhaul_entry_t* entry_;
  PluginInfo info_;
  std::unique_ptr<HostBinding> host_;
  bool initialized_ = false;
};

}  // namespace backhaul::plugins
