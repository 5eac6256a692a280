#include "core/plugins/plugin_loader.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include <Poco/DigestStream.h>
#include <Poco/SHA2Engine.h>
#include <boost/dll/shared_library.hpp>
#include <nlohmann/json.hpp>

#include "core/common/json_check.h"
#include "core/common/logging.h"
#include "core/common/seal.h"
#include "core/common/unique_fd.h"
#include "core/plugins/loaded_library.h"
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace backhaul::plugins {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void refuse(const fs::path& path, const std::string& reason) {
  throw PluginLoadError(path.string() + ": " + reason);
}

std::string version_string(backhaul_version_t v) {
  return std::to_string(v.major) + "." + std::to_string(v.minor);
}

// A plugin file's bytes, copied into a sealed in-memory file. The library is mapped from the copy,
// so what the allow-list checked is what runs, and nothing written to the file later reaches the
// process (an in-place overwrite of a mapped file, as `cp new.so old.so` does, kills the process
// with SIGBUS at its next read of a code page).
struct SealedCopy {
  UniqueFd fd;
  std::string sha256;  // of the bytes copied
  bool elf = false;    // they start with the ELF magic
};

constexpr int kSealed = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE;
// A plugin or a library it brings along bigger than this is refused rather than copied into memory.
constexpr off_t kMaxLibraryBytes = off_t{512} << 20;

// The bytes come from `sources[path]` when it has the path (read with pread: the descriptor's
// offset may be shared with another process), else from the file. A source that is sealed already
// (the daemon's copy, for a worker) is used as it is: hashed, not copied again.
SealedCopy seal_copy(const fs::path& path, const std::map<fs::path, int>& sources) {
  UniqueFd opened;
  int in = -1;
  off_t size_limit = -1;  // read to its end: a sealed source cannot change
  SealedCopy copy;
  if (auto it = sources.find(path); it != sources.end()) {
    in = it->second;
    const int seals = ::fcntl(in, F_GET_SEALS);
    if (seals >= 0 && (seals & kSealed) == kSealed) {
      copy.fd.reset(::fcntl(in, F_DUPFD_CLOEXEC, 0));
      if (!copy.fd) refuse(path, std::string("cannot be read: fcntl: ") + std::strerror(errno));
    }
  } else {
    // O_NONBLOCK: a FIFO at the path (a worker's describe answer names the files to copy) must
    // not hold the open; only a regular file is read, and no further than its size.
    opened.reset(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
    if (!opened) refuse(path, std::string("cannot be read: ") + std::strerror(errno));
    in = opened.get();
    struct stat st {};
    if (::fstat(in, &st) != 0) refuse(path, std::string("cannot be read: ") + std::strerror(errno));
    if (!S_ISREG(st.st_mode)) refuse(path, "is not a regular file");
    if (st.st_size > kMaxLibraryBytes) {
      refuse(path, "is larger than " + std::to_string(kMaxLibraryBytes >> 20) + " MiB");
    }
    size_limit = st.st_size;
  }
  const bool copying = !copy.fd;
  if (copying) {
    // The mapping shows this name in /proc/PID/maps (as /memfd:NAME); at most 249 bytes.
    std::string name = "backhaul-plugin:" + path.string();
    if (name.size() > 249) name = "backhaul-plugin:" + path.filename().string().substr(0, 200);
    copy.fd.reset(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (!copy.fd) {
      refuse(path, std::string("cannot be copied: memfd_create: ") + std::strerror(errno));
    }
  }
  Poco::SHA2Engine engine(Poco::SHA2Engine::SHA_256);
  std::vector<char> buffer(256 * 1024);
  bool first = true;
  for (off_t offset = 0; size_limit < 0 || offset < size_limit;) {
    const size_t want = size_limit < 0
                            ? buffer.size()
                            : static_cast<size_t>(std::min<off_t>(static_cast<off_t>(buffer.size()),
                                                                  size_limit - offset));
    ssize_t n = ::pread(in, buffer.data(), want, offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) refuse(path, std::string("cannot be read: ") + std::strerror(errno));
    if (n == 0) break;
    offset += n;
    if (first) {
      copy.elf =
          n >= 4 && buffer[0] == 0x7f && buffer[1] == 'E' && buffer[2] == 'L' && buffer[3] == 'F';
      first = false;
    }
    engine.update(buffer.data(), static_cast<unsigned>(n));
    for (ssize_t written = 0; copying && written < n;) {
      ssize_t w = ::write(copy.fd.get(), buffer.data() + written, static_cast<size_t>(n - written));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) refuse(path, std::string("cannot be copied: ") + std::strerror(errno));
      written += w;
    }
  }
  if (copying) {
    if (const int error = add_seals(copy.fd.get(), kSealed | F_SEAL_SEAL); error != 0) {
      refuse(path, std::string("cannot be sealed: ") + std::strerror(error));
    }
  }
  copy.sha256 = Poco::DigestEngine::digestToHex(engine.digest());
  return copy;
}

// The name dlopen() maps a copy by: /proc/PID/fd/N, which other processes (a debugger, ASan's
// symbolizer) can open too while the descriptor stays open. dlopen() returns an object already
// loaded under the same name without opening the file, and a library that outlived its dlclose()
// (glibc keeps some) may hold a name whose descriptor number is free again, so the descriptor
// moves to another number until its name is not taken.
//
// The process's number is read from /proc/self, not getpid(): they differ when the /proc mounted
// here belongs to another PID namespace (`unshare --pid` without a new /proc), where /proc/PID
// is some other process. The name must lead to the copy itself (same inode), or nothing loads.
std::string name_for_dlopen(const fs::path& path, UniqueFd& fd) {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self", ec);
  if (ec) refuse(path, "cannot be loaded: /proc/self cannot be read: " + ec.message());
  for (;;) {
    std::string name = "/proc/" + self.string() + "/fd/" + std::to_string(fd.get());
    struct stat named {
    }, copy{};
    if (::stat(name.c_str(), &named) != 0 || ::fstat(fd.get(), &copy) != 0 ||
        named.st_dev != copy.st_dev || named.st_ino != copy.st_ino) {
      refuse(path, "cannot be loaded: " + name +
                       " does not lead to its in-memory copy (is /proc this process's?)");
    }
    void* loaded = ::dlopen(name.c_str(), RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
    if (!loaded) return name;
    ::dlclose(loaded);
    UniqueFd other(::fcntl(fd.get(), F_DUPFD_CLOEXEC, fd.get() + 1));
    if (!other) refuse(path, std::string("cannot be loaded: fcntl: ") + std::strerror(errno));
    fd = std::move(other);
  }
}

// Reads `size` bytes at `offset` of the copy; false if the file is shorter.
bool read_at(int fd, uint64_t offset, void* out, size_t size) {
  auto* at = static_cast<char*>(out);
  while (size > 0) {
    ssize_t n = ::pread(fd, at, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    at += n;
    offset += static_cast<uint64_t>(n);
    size -= static_cast<size_t>(n);
  }
  return true;
}

// What the dynamic section of an ELF64 object asks of the loader: its DT_NEEDED names and its
// library search path (DT_RUNPATH, or DT_RPATH when it has no RUNPATH). Empty for anything this
// parser does not understand: dlopen() then judges the file and reports what is wrong with it.
struct DynamicNeeds {
  std::vector<std::string> needed;
  std::optional<std::string> runpath, rpath, soname;
};

DynamicNeeds read_dynamic_needs(int fd) {
  DynamicNeeds needs;
  Elf64_Ehdr eh{};
  if (!read_at(fd, 0, &eh, sizeof eh) || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
      eh.e_ident[EI_DATA] != ELFDATA2LSB || eh.e_phentsize != sizeof(Elf64_Phdr) ||
      eh.e_phnum == 0 || eh.e_phnum > 1024) {
    return needs;
  }
  std::vector<Elf64_Phdr> ph(eh.e_phnum);
  if (!read_at(fd, eh.e_phoff, ph.data(), ph.size() * sizeof(Elf64_Phdr))) return needs;
  const Elf64_Phdr* dynamic = nullptr;
  for (const auto& p : ph) {
    if (p.p_type == PT_DYNAMIC) dynamic = &p;
  }
  if (!dynamic || dynamic->p_filesz > (1u << 20)) return needs;
  std::vector<Elf64_Dyn> dyn(dynamic->p_filesz / sizeof(Elf64_Dyn));
  if (!read_at(fd, dynamic->p_offset, dyn.data(), dyn.size() * sizeof(Elf64_Dyn))) return needs;
  uint64_t strtab = 0, strsz = 0;
  std::optional<uint64_t> runpath, rpath, soname;
  std::vector<uint64_t> needed;
  for (const auto& d : dyn) {
    if (d.d_tag == DT_NULL) break;
    if (d.d_tag == DT_STRTAB) strtab = d.d_un.d_ptr;
    if (d.d_tag == DT_STRSZ) strsz = d.d_un.d_val;
    if (d.d_tag == DT_RUNPATH) runpath = d.d_un.d_val;
    if (d.d_tag == DT_RPATH) rpath = d.d_un.d_val;
    if (d.d_tag == DT_SONAME) soname = d.d_un.d_val;
    if (d.d_tag == DT_NEEDED) needed.push_back(d.d_un.d_val);
  }
  // DT_STRTAB is an address: the loadable segment that holds it gives its place in the file.
  std::optional<uint64_t> strtab_offset;
  for (const auto& p : ph) {
    if (p.p_type == PT_LOAD && strtab >= p.p_vaddr && strtab - p.p_vaddr < p.p_filesz) {
      strtab_offset = p.p_offset + (strtab - p.p_vaddr);
    }
  }
  if (!strtab_offset || strsz == 0 || strsz > (16u << 20)) return needs;
  std::string strings(strsz, '\0');
  if (!read_at(fd, *strtab_offset, strings.data(), strsz)) return needs;
  auto string_at = [&](uint64_t at) {
    return at < strings.size() ? std::string(strings.c_str() + at) : std::string();
  };
  for (uint64_t at : needed) needs.needed.push_back(string_at(at));
  if (runpath) needs.runpath = string_at(*runpath);
  if (rpath) needs.rpath = string_at(*rpath);
  if (soname) needs.soname = string_at(*soname);
  return needs;
}

// dlerror() names the library by the name it was opened by; the operator knows the file.
std::string with_path(std::string message, const std::string& name, const fs::path& path) {
  const std::string file = path.string();
  for (size_t at = message.find(name); at != std::string::npos;
       at = message.find(name, at + file.size())) {
    message.replace(at, name.size(), file);
  }
  return message;
}

// with_path() for every name in `names` (name -> file).
std::string with_paths(std::string message, const std::map<std::string, fs::path>& names) {
  for (const auto& [name, path] : names) message = with_path(std::move(message), name, path);
  return message;
}

// Loads are one at a time from the search for a plugin's bundled libraries to the plugin's own
// dlopen(): two plugins that share a library must not both find it missing and map two copies.
std::mutex load_mutex;

// The sealed copies of the libraries plugins bring along, by the name they are mapped under: a
// library two plugins share is loaded once, and its copy stays open until neither uses it.
// [load_mutex]
std::map<std::string, std::weak_ptr<const BundledCopy>> bundled_copies;

// A handle on an already loaded library whose SONAME is `soname` (it stays loaded while the
// handle is open), and the name glibc mapped it by; null if none is loaded.
std::pair<void*, std::string> find_loaded(const std::string& soname) {
  void* handle = ::dlopen(soname.c_str(), RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
  if (!handle) return {nullptr, ""};
  link_map* map = nullptr;
  std::string name;
  if (::dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name) name = map->l_name;
  return {handle, name};
}

// A library mapped from its copy has no directory, so glibc expands $ORIGIN in its RUNPATH/RPATH
// to /proc/PID/fd and finds nothing there. What it would have found there is loaded beforehand,
// each from a sealed copy of its own (hashed, checked against the allow-list, safe from
// overwrites, as the plugin is); glibc then takes a loaded library whose SONAME is the DT_NEEDED
// name instead of searching, so a bundled library must have that SONAME. The search follows
// glibc's: breadth first from the plugin (an object's own needs before theirs), in an object's
// RUNPATH, or else its RPATH and those of the objects that led to it (each that has no RUNPATH);
// the first directory that holds a file for this machine wins. A library found in a directory
// without $ORIGIN is left to glibc (its needs are looked at: it may inherit an RPATH with
// $ORIGIN), unless a library mapped alone needs it through an inherited RPATH: that one is loaded
// by its path first. One found nowhere is left to glibc's default search. A library already loaded
// in the process (by another plugin, say) is used as it is. The libraries found are all copied and
// checked first, then loaded dependencies first, so that glibc finds each by its SONAME. The
// handles are closed once the plugin is loaded: the plugin's own reference keeps the libraries, and
// it holds their copies, so that their names keep leading to them. [load_mutex]
// Unless the ELF object open as `fd` is for this process's machine (class, byte order and
// machine as this process's own executable), what it is for: "64-bit little-endian, machine 183
// (this host: 64-bit little-endian, machine 62)". A file that is no ELF object is not judged here.
std::optional<std::string> other_machine(int fd) {
  static const std::optional<Elf64_Ehdr> self = [] {
    UniqueFd exe(::open("/proc/self/exe", O_RDONLY | O_CLOEXEC));
    Elf64_Ehdr eh{};
    if (!exe || !read_at(exe.get(), 0, &eh, sizeof eh)) return std::optional<Elf64_Ehdr>();
    return std::optional<Elf64_Ehdr>(eh);
  }();
  Elf64_Ehdr eh{};
  if (!self || !read_at(fd, 0, &eh, sizeof eh) || std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0) {
    return std::nullopt;
  }
  if (eh.e_ident[EI_CLASS] == self->e_ident[EI_CLASS] &&
      eh.e_ident[EI_DATA] == self->e_ident[EI_DATA] && eh.e_machine == self->e_machine) {
    return std::nullopt;
  }
  const auto described = [](const Elf64_Ehdr& h) {
    return std::string(h.e_ident[EI_CLASS] == ELFCLASS64 ? "64-bit" : "32-bit") +
           (h.e_ident[EI_DATA] == ELFDATA2LSB ? " little-endian" : " big-endian") + ", machine " +
           std::to_string(h.e_machine);
  };
  return described(eh) + " (this host: " + described(*self) + ")";
}

// What dlopen() said, out of Boost.DLL's "boost::dll::shared_library::load() failed (dlerror
// system message: X): Bad file descriptor", whose errno part means nothing after a dlopen().
std::string dlopen_reason(const std::string& what) {
  const std::string marker = "(dlerror system message: ";
  const size_t from = what.find(marker);
  const size_t to = what.rfind("): ");
  if (from == std::string::npos || to == std::string::npos || to < from) return what;
  return what.substr(from + marker.size(), to - from - marker.size());
}

class OriginDependencies {
 public:
  OriginDependencies(const fs::path& plugin, const LoadOptions& options)
      : plugin_(plugin),
        allowed_sha256_(options.allowed_sha256),
        sealed_sources_(options.sealed_sources) {}
  OriginDependencies(const OriginDependencies&) = delete;
  OriginDependencies& operator=(const OriginDependencies&) = delete;
  ~OriginDependencies() {
    for (void* handle : handles_) ::dlclose(handle);
  }

  // Loads what the plugin at `path` (its copy open as `fd`) finds through $ORIGIN.
  void load(const fs::path& path, int fd) {
    std::deque<Object> queue{{path, fd, {}, false}};
    while (!queue.empty()) {
      plan(queue.front(), queue);
      queue.pop_front();
    }
    load_planned();
  }

  // The bundled libraries the plugin uses (loaded now or before), to hold while it is loaded.
  std::vector<std::shared_ptr<const BundledCopy>> take_used() { return std::move(used_); }
  // Their copies' names, to put the files' paths in place of in dlerror() messages.
  const std::map<std::string, fs::path>& names() const { return names_; }

 private:
  struct Dir {
    std::string path;
    bool from_origin;
    bool inherited = false;  // from the RPATH of an object that led to the one searching
  };
  struct Object {  // whose needs are to be found
    fs::path path;
    int fd;
    std::vector<Dir> inherited;  // the RPATHs of the objects that led to it
    bool alone;  // dlopen()ed by itself before the plugin: inherited directories are lost to it
  };
  struct Planned {
    std::string needed;                 // the DT_NEEDED name it stands for
    std::shared_ptr<BundledCopy> copy;  // a bundled library: mapped from this sealed copy
    fs::path path;                      // else a library of another directory, loaded by path
    UniqueFd file;                      // (open for reading its needs)
    std::vector<std::string> needs;
  };

  // `search` with $ORIGIN (and ${ORIGIN}) made the directory of `object`.
  static std::vector<Dir> expand(const std::optional<std::string>& search, const fs::path& object) {
    std::vector<Dir> dirs;
    if (!search) return dirs;
    const std::string origin = fs::absolute(object).parent_path().string();
    std::string_view rest = *search;
    while (!rest.empty()) {
      const size_t colon = rest.find(':');
      std::string dir(rest.substr(0, colon));
      rest = colon == std::string_view::npos ? std::string_view() : rest.substr(colon + 1);
      bool from_origin = false;
      for (const char* token : {"${ORIGIN}", "$ORIGIN"}) {
        for (size_t at = dir.find(token); at != std::string::npos; at = dir.find(token, at)) {
          dir.replace(at, std::strlen(token), origin);
          at += origin.size();
          from_origin = true;
        }
      }
      if (!dir.empty()) dirs.push_back({std::move(dir), from_origin});
    }
    return dirs;
  }

  // Finds, copies and checks what `object` needs from $ORIGIN directories; what they need in turn
  // goes to the end of `queue`.
  void plan(const Object& object, std::deque<Object>& queue) {
    const DynamicNeeds needs = read_dynamic_needs(object.fd);
    // A RUNPATH serves the object alone; an RPATH is searched before the inherited ones and is
    // passed on with them.
    std::vector<Dir> search = expand(needs.runpath ? needs.runpath : needs.rpath, object.path);
    std::vector<Dir> passed_on = object.inherited;
    if (!needs.runpath) {
      search.insert(search.end(), object.inherited.begin(), object.inherited.end());
      passed_on = search;
    }
    for (Dir& dir : passed_on) dir.inherited = true;
    bool any_origin = false;
    for (const Dir& dir : search) any_origin = any_origin || dir.from_origin;
    for (const std::string& name : needs.needed) {
      if (name.empty() || name.find('/') != std::string::npos || !seen_names_.insert(name).second) {
        continue;
      }
      if (use_loaded(name)) continue;
      if (!any_origin) continue;
      for (const Dir& dir : search) {
        const fs::path candidate = fs::path(dir.path) / name;
        std::error_code ec;
        const bool sealed = dir.from_origin && sealed_sources_.count(candidate);
        if (!sealed && !fs::is_regular_file(candidate, ec)) continue;
        Planned planned{name, nullptr, {}, {}, {}};
        int fd = -1;
        if (dir.from_origin) {
          planned.copy = copy_of(candidate);
          fd = planned.copy->fd.get();
        } else {
          planned.path = candidate;
          planned.file.reset(::open(candidate.c_str(), O_RDONLY | O_CLOEXEC));
          fd = planned.file.get();
          if (fd < 0) continue;
        }
        if (!for_this_machine(fd)) continue;  // glibc passes over it too
        if (planned.copy) check_allowed(*planned.copy);
        const DynamicNeeds own = read_dynamic_needs(fd);
        // One found outside $ORIGIN is glibc's to load as the plugin's dependency (in the
        // plugin's scope, from its own search: hwcaps, LD_LIBRARY_PATH), unless what needs it is
        // loaded alone before the plugin and found it through an inherited RPATH, which glibc
        // would not search then: that one is loaded by its path first. Either way, what it
        // needs through $ORIGIN is looked for too.
        if (planned.copy && own.soname != name) {
          refuse(plugin_,
                 "its library " + candidate.string() +
                     (own.soname ? " has SONAME '" + *own.soname + "'" : " has no SONAME") +
                     ", and only a library whose SONAME is the name it is linked by ('" + name +
                     "') can be used from its sealed copy");
        }
        const bool load_first =
            planned.copy || (object.alone && dir.inherited && own.soname == name);
        planned.needs = own.needed;
        queue.push_back({candidate, fd, passed_on, load_first});
        if (load_first) {
          planned_names_.insert(name);
          planned_.push_back(std::move(planned));
        } else {
          walked_.push_back(std::move(planned.file));  // open until its needs are planned
        }
        break;
      }
    }
  }

  static bool for_this_machine(int fd) { return !other_machine(fd); }

  // Whether a library whose SONAME is `soname` is loaded already. If it is one that another
  // plugin brought along, this one holds its copy too (and lists it); either way it stays loaded
  // until this plugin is.
  bool use_loaded(const std::string& soname) {
    auto [handle, name] = find_loaded(soname);
    if (!handle) return false;
    handles_.push_back(handle);
    std::shared_ptr<const BundledCopy> copy;
    if (auto it = bundled_copies.find(name); it != bundled_copies.end()) copy = it->second.lock();
    if (!copy) return true;  // a library of the system's, or one no plugin holds any more
    check_allowed(*copy);
    names_.emplace(copy->name, copy->path);
    used_.push_back(std::move(copy));
    return true;
  }

  void check_allowed(const fs::path& library, const std::string& sha256) const {
    if (!allowed_sha256_.empty() && !allowed_sha256_.count(sha256)) {
      refuse(plugin_, "its library " + library.string() + " has sha256 " + sha256 +
                          ", which is not in the plugin allow-list");
    }
  }
  void check_allowed(const BundledCopy& copy) const { check_allowed(copy.path, copy.sha256); }

  std::shared_ptr<BundledCopy> copy_of(const fs::path& library) {
    const std::string what = "its library " + library.string();
    SealedCopy sealed;
    try {  // these name the library first
      sealed = seal_copy(library, sealed_sources_);
    } catch (const PluginLoadError& e) {
      refuse(plugin_, std::string("its library ") + e.what());
    }
    if (!sealed.elf) {
      check_allowed(library, sealed.sha256);
      refuse(plugin_, what + " is not an ELF shared object");
    }
    auto copy = std::make_shared<BundledCopy>();
    copy->fd = std::move(sealed.fd);
    copy->path = library;
    copy->sha256 = std::move(sealed.sha256);
    return copy;
  }

  // Loads the planned libraries, each after the planned ones it needs (a cycle is loaded as it
  // comes, and glibc reports what it cannot resolve).
  void load_planned() {
    std::set<std::string> loaded;
    std::vector<bool> done(planned_.size(), false);
    for (size_t round = 0; round < planned_.size(); ++round) {
      size_t next = planned_.size();
      for (size_t i = 0; i < planned_.size() && next == planned_.size(); ++i) {
        if (done[i]) continue;
        bool ready = true;
        for (const std::string& need : planned_[i].needs) {
          ready = ready && (!planned_names_.count(need) || loaded.count(need));
        }
        if (ready) next = i;
      }
      if (next == planned_.size()) {
        next = static_cast<size_t>(std::find(done.begin(), done.end(), false) - done.begin());
      }
      load_one(planned_[next]);
      done[next] = true;
      loaded.insert(planned_[next].needed);
    }
  }

  void load_one(Planned& planned) {
    if (!planned.copy) {
      void* handle = ::dlopen(planned.path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (!handle) {
        const char* error = ::dlerror();
        refuse(plugin_, "its library " + planned.path.string() + " does not load: " +
                            with_paths(error ? error : "unknown error", names_));
      }
      handles_.push_back(handle);
      planned.file.reset();
      return;
    }
    BundledCopy& copy = *planned.copy;
    try {
      copy.name = name_for_dlopen(copy.path, copy.fd);
    } catch (const PluginLoadError& e) {
      refuse(plugin_, std::string("its library ") + e.what());
    }
    names_.emplace(copy.name, copy.path);
    void* handle = ::dlopen(copy.name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      const char* error = ::dlerror();
      refuse(plugin_, "its library " + copy.path.string() +
                          " does not load: " + with_paths(error ? error : "unknown error", names_));
    }
    handles_.push_back(handle);
    std::erase_if(bundled_copies, [](const auto& entry) { return entry.second.expired(); });
    bundled_copies[copy.name] = planned.copy;
    used_.push_back(planned.copy);
  }

  const fs::path& plugin_;
  const std::set<std::string>& allowed_sha256_;
  const std::map<fs::path, int>& sealed_sources_;
  std::set<std::string> seen_names_;     // needs found (or left to glibc) already
  std::set<std::string> planned_names_;  // those that are planned
  std::vector<Planned> planned_;
  std::vector<UniqueFd> walked_;  // libraries whose needs are looked at, left to glibc to load
  std::vector<void*> handles_;
  std::vector<std::shared_ptr<const BundledCopy>> used_;
  std::map<std::string, fs::path> names_;
};

// Checks the entry's fixed prefix (size, version, magic) and its function table. Reads nothing
// beyond the size the plugin declared.
void check_entry(const fs::path& path, const backhaul_entry_t& entry) {
  constexpr size_t kPrefix = offsetof(backhaul_entry_t, descriptor);
  if (entry.struct_size < kPrefix) {
    refuse(path, "backhaul_entry is too small (" + std::to_string(entry.struct_size) +
                     " bytes) to hold a version and magic block");
  }
  const backhaul_magic_t& m = entry.magic;
  if (m.magic != BACKHAUL_ABI_MAGIC) refuse(path, "backhaul_entry has a wrong magic number");
  // The versions before the layout: another major may well change the sizes, and the message
  // that helps is the one naming both versions (SPEC A5).
  const backhaul_version_t ours = BACKHAUL_ABI_VERSION_INIT;
  const backhaul_version_t theirs = entry.abi_version;
  if (theirs.major != ours.major) {
    refuse(path, "plugin ABI " + version_string(theirs) + " is incompatible with host ABI " +
                     version_string(ours) + " (major versions differ)");
  }
  if (theirs.minor > ours.minor) {
    refuse(path, "plugin ABI " + version_string(theirs) + " is newer than host ABI " +
                     version_string(ours) + "; upgrade the host");
  }
  if (m.pointer_size != sizeof(void*) || m.string_size != sizeof(backhaul_string_t) ||
      m.error_size != sizeof(backhaul_error_t) || m.event_size != sizeof(backhaul_event_t)) {
    refuse(path, "backhaul_entry layout does not match this host (pointer " +
                     std::to_string(m.pointer_size) + ", string " + std::to_string(m.string_size) +
                     ", error " + std::to_string(m.error_size) + ", event " +
                     std::to_string(m.event_size) + " bytes)");
  }
  size_t needed = theirs.minor == 0 ? BACKHAUL_ENTRY_SIZE_V1_0 : sizeof(backhaul_entry_t);
  if (entry.struct_size < needed) {
    refuse(path, "backhaul_entry is " + std::to_string(entry.struct_size) + " bytes, ABI " +
                     version_string(theirs) + " needs " + std::to_string(needed));
  }
  if (!entry.descriptor) refuse(path, "backhaul_entry has no descriptor");
  if (!entry.init || !entry.deinit || !entry.validate_config || !entry.create || !entry.destroy ||
      !entry.validate_scopes || !entry.fetch_page || !entry.release_page) {
    refuse(path, "backhaul_entry lacks a required function");
  }
}

// A plugin's string in a message: its first 100 bytes (an id may be any length).
std::string shown(const std::string& text) {
  return text.size() <= 100 ? text : text.substr(0, 100) + "...";
}

std::vector<std::string> string_list(const fs::path& path, const char* const* items, size_t count,
                                     const char* what) {
  if (count > 0 && !items) refuse(path, std::string(what) + " list is null");
  std::vector<std::string> out;
  for (size_t i = 0; i < count; ++i) {
    if (!items[i]) refuse(path, std::string(what) + " has an empty entry");
    out.emplace_back(items[i]);  // checked with the rest (check_plugin_info)
  }
  return out;
}

PluginInfo read_descriptor(const fs::path& path, const backhaul_entry_t& entry) {
  const backhaul_descriptor_t& d = *entry.descriptor;
  if (d.struct_size < sizeof(backhaul_descriptor_t)) {
    refuse(path, "descriptor is too small (" + std::to_string(d.struct_size) + " bytes)");
  }
  PluginInfo info;
  auto text = [&](const char* s, const char* field) {
    if (!s) refuse(path, std::string("descriptor.") + field + " is null");
    return std::string(s);
  };
  info.id = text(d.id, "id");
  info.version = text(d.version, "version");
  info.display_name = text(d.display_name, "display_name");
  info.description = d.description ? text(d.description, "description") : "";
  info.entity_types = string_list(path, d.entity_types, d.entity_type_count, "entity types");
  info.default_entity_types = string_list(path, d.default_entity_types, d.default_entity_type_count,
                                          "default entity types");
  info.config_schema_json = text(d.config_schema_json, "config_schema_json");
  info.abi_version = entry.abi_version;
  info.path = path;
  check_plugin_info(info);
  return info;
}

}  // namespace

void check_plugin_info(const PluginInfo& info) {
  const fs::path& path = info.path;
  // Every descriptor string ends up in JSON (the admin API, `plugin info --json`), which cannot
  // hold anything else.
  auto utf8 = [&](const std::string& s, const char* field) {
    if (!is_utf8(s)) refuse(path, std::string("descriptor.") + field + " is not valid UTF-8");
  };
  utf8(info.id, "id");
  if (!is_valid_plugin_id(info.id)) {
    refuse(path, "plugin id '" + shown(info.id) + "' does not match [a-z][a-z0-9_-]*");
  }
  utf8(info.version, "version");
  if (!is_semver(info.version)) {
    refuse(path,
           "plugin '" + shown(info.id) + "' version '" + shown(info.version) + "' is not semantic");
  }
  utf8(info.display_name, "display_name");
  utf8(info.description, "description");
  for (const auto* list : {&info.entity_types, &info.default_entity_types}) {
    const char* what = list == &info.entity_types ? "entity types" : "default entity types";
    for (const std::string& item : *list) {
      if (item.empty()) refuse(path, std::string(what) + " has an empty entry");
      if (!is_utf8(item)) refuse(path, std::string(what) + " has an entry that is not UTF-8");
    }
  }
  if (info.entity_types.empty()) refuse(path, "plugin '" + info.id + "' has no entity types");
  std::set<std::string> unique(info.entity_types.begin(), info.entity_types.end());
  if (unique.size() != info.entity_types.size()) {
    refuse(path, "plugin '" + info.id + "' lists an entity type twice");
  }
  for (const auto& t : info.default_entity_types) {
    if (!unique.count(t)) {
      refuse(path,
             "plugin '" + info.id + "' default entity type '" + shown(t) + "' is not supported");
    }
  }
  utf8(info.config_schema_json, "config_schema_json");
  if (const size_t depth = json_depth(info.config_schema_json); depth > kMaxConfigSchemaDepth) {
    refuse(path, "plugin '" + info.id + "' config schema nests " + std::to_string(depth) +
                     " deep; at most " + std::to_string(kMaxConfigSchemaDepth));
  }
  auto schema = nlohmann::json::parse(info.config_schema_json, nullptr, false);
  if (schema.is_discarded() || !schema.is_object()) {
    refuse(path, "plugin '" + info.id + "' config schema is not a JSON object");
  }
}

LoadedLibrary::~LoadedLibrary() {
  if (!initialized_) return;
  try {
    entry_->deinit();
  } catch (...) {
    try {
      logging::get("plugins")->error("plugin '{}' let a C++ exception cross the ABI in deinit",
                                     info_.id);
    } catch (...) {
    }
  }
}

SealedFile seal_file(const fs::path& path) {
  SealedCopy copy = seal_copy(path, {});
  return {path, std::move(copy.fd), std::move(copy.sha256)};
}

Plugin load_plugin(const fs::path& path, const HostServices& services, const LoadOptions& options) {
  // A worker given the daemon's sealed copy loads that, whatever is at the path now (the file
  // written over or deleted since the daemon loaded it).
  if (!options.sealed_sources.count(path)) {
    std::error_code ec;
    if (!fs::exists(path, ec)) refuse(path, "file does not exist");
    if (!fs::is_regular_file(path, ec)) refuse(path, "is not a regular file");
  }
  SealedCopy copy = seal_copy(path, options.sealed_sources);
  if (!options.allowed_sha256.empty() && !options.allowed_sha256.count(copy.sha256)) {
    refuse(path, "sha256 " + copy.sha256 + " is not in the plugin allow-list");
  }
  if (!copy.elf) refuse(path, "is not an ELF shared object");
  // dlopen() would say "cannot open shared object file: No such file or directory".
  if (const auto other = other_machine(copy.fd.get())) refuse(path, "is built for " + *other);

  std::unique_lock lock(load_mutex);
  OriginDependencies dependencies(path, options);
  dependencies.load(path, copy.fd.get());
  const std::string name = name_for_dlopen(path, copy.fd);
  boost::dll::shared_library library;
  try {
    // RTLD_LOCAL: plugins never see each other's symbols. RTLD_NOW: missing symbols fail here.
    library.load(name, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
  } catch (const std::exception& e) {
    refuse(path, "cannot be loaded: " + with_paths(with_path(dlopen_reason(e.what()), name, path),
                                                   dependencies.names()));
  }
  lock.unlock();
  if (!library.has(BACKHAUL_ENTRY_SYMBOL)) {
    refuse(path, "does not export the entry symbol " BACKHAUL_ENTRY_SYMBOL);
  }
  const auto& entry = library.get<const backhaul_entry_t>(BACKHAUL_ENTRY_SYMBOL);
  check_entry(path, entry);
  PluginInfo info = read_descriptor(path, entry);
  info.sha256 = std::move(copy.sha256);
  std::vector<std::shared_ptr<const BundledCopy>> shared = dependencies.take_used();
  for (const auto& b : shared) info.bundled_libraries.push_back({b->path, b->sha256});
  if (options.before_init) options.before_init(info);

  auto host = std::make_unique<HostBinding>(services, info.id);
  const backhaul_host_t* c_host = host->c_host();
  auto loaded =
      std::make_shared<LoadedLibrary>(std::move(copy.fd), std::move(shared), std::move(library),
                                      &entry, std::move(info), std::move(host));
  backhaul_error_t error{};
  int32_t initialized = 0;
  try {
    initialized = entry.init(c_host, &error);
  } catch (const std::exception& e) {
    refuse(path, "plugin '" + loaded->info().id +
                     "' init let a C++ exception cross the ABI: " + e.what());
  } catch (...) {
    refuse(path, "plugin '" + loaded->info().id +
                     "' init let a C++ exception cross the ABI (not a std::exception)");
  }
  if (!initialized) {
    error.message[sizeof(error.message) - 1] = '\0';
    refuse(path, "plugin '" + loaded->info().id + "' init failed: " + error.message);
  }
  loaded->mark_initialized();
  auto log = logging::get("plugins");
  log->info("loaded plugin {} {} (abi {}) from {}", loaded->info().id, loaded->info().version,
            version_string(entry.abi_version), path.string());
  for (const BundledLibrary& bundled : loaded->info().bundled_libraries) {
    log->info("plugin {} brings along {} (sha256 {})", loaded->info().id, bundled.path.string(),
              bundled.sha256);
  }
  return Plugin(std::move(loaded));
}

std::vector<LoadProblem> PluginRegistry::load_directory(const fs::path& dir) {
  std::vector<LoadProblem> problems;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    problems.push_back({dir, fs::exists(dir, ec) ? "plugin directory is not a directory"
                                                 : "plugin directory does not exist"});
    logging::get("plugins")->warn("{}: {}", dir.string(), problems.back().reason);
    return problems;
  }
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().extension() == ".so") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  if (!isolation_) {
    for (const auto& file : files) {
      if (auto problem = load_file(file)) problems.push_back(std::move(*problem));
    }
    return problems;
  }
  // Each file loads in a worker process of its own, a few at once; they are registered in file
  // order, so which of two files with one id is the duplicate does not depend on which was faster.
  std::vector<std::optional<Plugin>> loaded(files.size());
  std::vector<std::exception_ptr> failed(files.size());
  std::atomic<size_t> next{0};
  auto load_next = [&] {
    for (size_t i; (i = next++) < files.size();) {
      try {
        loaded[i] = load_isolated(files[i], *isolation_, load_options(files[i]));
      } catch (...) {
        failed[i] = std::current_exception();
      }
    }
  };
  const size_t threads = std::min<size_t>(files.size(), kParallelIsolatedLoads);
  std::vector<std::thread> loaders;
  for (size_t t = 1; t < threads; ++t) loaders.emplace_back(load_next);
  load_next();
  for (std::thread& loader : loaders) loader.join();
  for (size_t i = 0; i < files.size(); ++i) {
    if (auto problem = add(files[i], [&]() -> Plugin {
          if (failed[i]) std::rethrow_exception(failed[i]);
          refuse_duplicate(files[i], loaded[i]->info());
          return std::move(*loaded[i]);
        })) {
      problems.push_back(std::move(*problem));
    }
  }
  return problems;
}

std::optional<LoadProblem> PluginRegistry::load_file(const fs::path& path) {
  return add(path, [&] {
    return isolation_ ? load_isolated(path, *isolation_, load_options(path))
                      : load_plugin(path, services_, load_options(path));
  });
}

LoadOptions PluginRegistry::load_options(const fs::path& path) const {
  LoadOptions options;
  options.allowed_sha256 = allowed_sha256_;
  // Before init() (in this process): a second instance of a plugin is never started.
  options.before_init = [this, path](const PluginInfo& info) { refuse_duplicate(path, info); };
  return options;
}

void PluginRegistry::refuse_duplicate(const fs::path& path, const PluginInfo& info) const {
  if (auto it = by_id_.find(info.id); it != by_id_.end()) {
    refuse(path, "duplicate plugin id '" + info.id + "' (already loaded from " +
                     it->second.info().path.string() + ")");
  }
}

std::optional<LoadProblem> PluginRegistry::add(const fs::path& path,
                                               const std::function<Plugin()>& load) {
  try {
    Plugin plugin = load();
    const std::string id = plugin.info().id;
    by_id_.emplace(id, std::move(plugin));
    return std::nullopt;
  } catch (const std::exception& e) {
    logging::get("plugins")->error("skipping plugin: {}", e.what());
    std::string reason = e.what();
    std::string prefix = path.string() + ": ";
    if (reason.rfind(prefix, 0) == 0) reason.erase(0, prefix.size());
    return LoadProblem{path, reason};
  }
}

std::optional<Plugin> PluginRegistry::find(std::string_view id) const {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return std::nullopt;
  return it->second;
}

std::vector<Plugin> PluginRegistry::plugins() const {
  std::vector<Plugin> out;
  for (const auto& [id, plugin] : by_id_) out.push_back(plugin);
  return out;
}

namespace {

bool is_identifier_char(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '-';
}
bool is_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}
// A numeric identifier: digits, no leading zero.
bool is_number(std::string_view s) { return is_digits(s) && (s.size() == 1 || s[0] != '0'); }

// `text` split at '.' into `parts` (or any number with parts = 0), each passing `ok`.
template <class Ok>
bool dotted(std::string_view text, size_t parts, Ok ok) {
  size_t seen = 0;
  while (true) {
    const size_t dot = text.find('.');
    if (!ok(text.substr(0, dot))) return false;
    ++seen;
    if (dot == std::string_view::npos) return parts == 0 || seen == parts;
    text.remove_prefix(dot + 1);
  }
}

}  // namespace

bool is_valid_plugin_id(std::string_view id) {
  if (id.empty() || id[0] < 'a' || id[0] > 'z') return false;
  return std::all_of(id.begin() + 1, id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
}

bool is_semver(std::string_view version) {
  auto identifier = [](std::string_view s) {
    return !s.empty() && std::all_of(s.begin(), s.end(), is_identifier_char);
  };
  if (const size_t plus = version.find('+'); plus != std::string_view::npos) {
    if (!dotted(version.substr(plus + 1), 0, identifier)) return false;  // build metadata
    version = version.substr(0, plus);
  }
  if (const size_t dash = version.find('-'); dash != std::string_view::npos) {
    // Pre-release: numeric identifiers without leading zeros.
    auto pre = [&](std::string_view s) { return identifier(s) && (!is_digits(s) || is_number(s)); };
    if (!dotted(version.substr(dash + 1), 0, pre)) return false;
    version = version.substr(0, dash);
  }
  return dotted(version, 3, is_number);
}

}  // namespace backhaul::plugins
