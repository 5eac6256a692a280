#include "core/validate/elf_inspect.h"

#include <algorithm>
#include <cstring>
#include <fstream>

#include <elf.h>

namespace backhaul::validate {
namespace {

constexpr size_t kMaxFileBytes = size_t{512} << 20;
constexpr size_t kExportSample = 8;

// The machine this process runs as, read from its own executable: a plugin must match it.
uint16_t own_machine() {
  std::ifstream self("/proc/self/exe", std::ios::binary);
  Elf64_Ehdr header{};
  self.read(reinterpret_cast<char*>(&header), sizeof header);
  return self ? header.e_machine : 0;
}

template <class T>
bool read_at(const std::string& data, uint64_t offset, T& out) {
  if (offset > data.size() || data.size() - offset < sizeof(T)) return false;
  std::memcpy(&out, data.data() + offset, sizeof(T));
  return true;
}

std::string check_header(const std::string& data, Elf64_Ehdr& header) {
  if (data.size() < EI_NIDENT || std::memcmp(data.data(), ELFMAG, SELFMAG) != 0)
    return "is not an ELF file";
  if (static_cast<unsigned char>(data[EI_CLASS]) != ELFCLASS64)
    return "is a 32-bit ELF file; this host is 64-bit";
  if (static_cast<unsigned char>(data[EI_DATA]) != ELFDATA2LSB)
    return "is a big-endian ELF file; this host is little-endian";
  if (!read_at(data, 0, header)) return "has a truncated ELF header";
  if (header.e_type != ET_DYN)
    return header.e_type == ET_EXEC
               ? "is an executable, not a shared object"
               : "is not a shared object (e_type " + std::to_string(header.e_type) + ")";
  const uint16_t machine = own_machine();
  if (machine != 0 && header.e_machine != machine)
    return "is built for machine " + std::to_string(header.e_machine) + ", this host is " +
           std::to_string(machine);
  return {};
}

std::string symbol_name(const std::string& data, const Elf64_Shdr& strtab, uint32_t offset) {
  if (offset >= strtab.sh_size || strtab.sh_offset > data.size()) return {};
  const uint64_t start = strtab.sh_offset + offset;
  if (start >= data.size()) return {};
  const uint64_t limit = std::min<uint64_t>(data.size(), strtab.sh_offset + strtab.sh_size);
  const char* begin = data.data() + start;
  return std::string(begin, strnlen(begin, limit - start));
}

void scan_symbols(const std::string& data, const Elf64_Shdr& dynsym, const Elf64_Shdr& strtab,
                  const std::string& wanted, ElfFacts& facts) {
  if (dynsym.sh_entsize != sizeof(Elf64_Sym)) return;
  const uint64_t count = dynsym.sh_size / sizeof(Elf64_Sym);
  for (uint64_t i = 1; i < count; ++i) {  // index 0 is the null symbol
    Elf64_Sym sym{};
    if (!read_at(data, dynsym.sh_offset + i * sizeof(Elf64_Sym), sym)) return;
    const bool defined = sym.st_shndx != SHN_UNDEF;
    const int binding = ELF64_ST_BIND(sym.st_info);
    // GNU unique symbols (static locals of inline functions, typeinfo) are bound process-wide.
    const bool global = binding == STB_GLOBAL || binding == STB_WEAK || binding == STB_GNU_UNIQUE;
    const int visibility = ELF64_ST_VISIBILITY(sym.st_other);
    const bool visible = visibility == STV_DEFAULT || visibility == STV_PROTECTED;
    std::string name = symbol_name(data, strtab, sym.st_name);
    if (name == wanted) {
      facts.entry = ElfSymbol{sym.st_size, defined, global, visible,
                              ELF64_ST_TYPE(sym.st_info) == STT_OBJECT};
    } else if (defined && global && visible && !name.empty() && sym.st_shndx != SHN_ABS) {
      // (An absolute symbol is no code or data: a version node a version script names, "PLUGIN_1".)
      ++facts.exported_others;
      if (facts.exported_sample.size() < kExportSample) {
        facts.exported_sample.push_back(std::move(name));
      }
    }
  }
}

void find_dynsym(const std::string& data, const Elf64_Ehdr& header, const std::string& wanted,
                 ElfFacts& facts) {
  if (header.e_shoff == 0 || header.e_shentsize != sizeof(Elf64_Shdr)) return;
  for (uint16_t i = 0; i < header.e_shnum; ++i) {
    Elf64_Shdr section{};
    if (!read_at(data, header.e_shoff + uint64_t{i} * sizeof(Elf64_Shdr), section)) return;
    if (section.sh_type != SHT_DYNSYM) continue;
    Elf64_Shdr strtab{};
    if (section.sh_link >= header.e_shnum ||
        !read_at(data, header.e_shoff + uint64_t{section.sh_link} * sizeof(Elf64_Shdr), strtab))
      return;
    facts.has_dynsym = true;
    scan_symbols(data, section, strtab, wanted, facts);
    return;
  }
}

}  // namespace

ElfFacts inspect_elf(const std::filesystem::path& path, const std::string& symbol) {
  ElfFacts facts;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    facts.problem = "does not exist";
    return facts;
  }
  if (!std::filesystem::is_regular_file(path, ec)) {
    facts.problem = "is not a regular file";
    return facts;
  }
  const auto size = std::filesystem::file_size(path, ec);
  if (ec || size > kMaxFileBytes) {
    facts.problem = ec ? "cannot be sized: " + ec.message() : "is larger than 512 MB";
    return facts;
  }
  std::ifstream in(path, std::ios::binary);
  std::string data(size, '\0');
  if (!in.read(data.data(), static_cast<std::streamsize>(size))) {
    facts.problem = "cannot be read";
    return facts;
  }
  Elf64_Ehdr header{};
  facts.problem = check_header(data, header);
  if (facts.problem.empty()) find_dynsym(data, header, symbol, facts);
  return facts;
}

}  // namespace backhaul::validate
