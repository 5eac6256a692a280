#include "core/validate/elf_inspect.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <optional>
#include <utility>
#include <vector>

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

// The program headers, or none when they cannot all be read.
std::vector<Elf64_Phdr> program_headers(const std::string& data, const Elf64_Ehdr& header) {
  std::vector<Elf64_Phdr> out;
  if (header.e_phentsize != sizeof(Elf64_Phdr)) return out;
  for (uint16_t i = 0; i < header.e_phnum; ++i) {
    Elf64_Phdr segment{};
    if (!read_at(data, header.e_phoff + uint64_t{i} * sizeof(Elf64_Phdr), segment)) return {};
    out.push_back(segment);
  }
  return out;
}

// Why the file is cut short of what its headers describe, or "". Section headers past its end
// were taken for absent ones (and the symbol checks skipped); a segment past it cannot be mapped.
std::string truncation(const std::string& data, const Elf64_Ehdr& header,
                       const std::vector<Elf64_Phdr>& segments) {
  const uint64_t size = data.size();
  auto past_end = [&](uint64_t offset, uint64_t length) {
    return offset > size || length > size - offset;
  };
  const std::string at_end = " past the end of the file (" + std::to_string(size) + " bytes)";
  if (past_end(header.e_phoff, uint64_t{header.e_phnum} * header.e_phentsize))
    return "is truncated: its program headers end" + at_end;
  if (header.e_shoff != 0 &&
      past_end(header.e_shoff, uint64_t{header.e_shnum} * header.e_shentsize))
    return "is truncated: its section headers end" + at_end;
  for (size_t i = 0; i < segments.size(); ++i) {
    if (segments[i].p_type == PT_LOAD && past_end(segments[i].p_offset, segments[i].p_filesz))
      return "is truncated: its segment " + std::to_string(i) + " ends" + at_end;
  }
  return {};
}

// Where the loadable segment that maps virtual address `vaddr` has it in the file: the offset, and
// the bytes of the segment's file image from there. nullopt when no segment maps it from the file.
std::optional<std::pair<uint64_t, uint64_t>> file_range(const std::vector<Elf64_Phdr>& segments,
                                                        uint64_t vaddr) {
  for (const Elf64_Phdr& p : segments) {
    if (p.p_type == PT_LOAD && vaddr >= p.p_vaddr && vaddr - p.p_vaddr < p.p_filesz)
      return std::pair{p.p_offset + (vaddr - p.p_vaddr), p.p_filesz - (vaddr - p.p_vaddr)};
  }
  return std::nullopt;
}

// How many symbols the dynamic symbol table holds, from DT_GNU_HASH (one past the last symbol of
// the longest chain of its highest bucket) or DT_HASH (nchain); nullopt when neither can be read.
std::optional<uint64_t> symbol_count(const std::string& data,
                                     const std::vector<Elf64_Phdr>& segments, uint64_t gnu_hash,
                                     uint64_t hash) {
  if (gnu_hash != 0) {
    const auto at = file_range(segments, gnu_hash);
    uint32_t head[4];  // nbuckets, symoffset, bloom_size, bloom_shift
    if (!at || !read_at(data, at->first, head)) return std::nullopt;
    const uint64_t buckets = at->first + sizeof head + uint64_t{head[2]} * sizeof(uint64_t);
    const uint64_t chains = buckets + uint64_t{head[0]} * sizeof(uint32_t);
    uint32_t last = 0;
    for (uint32_t b = 0; b < head[0]; ++b) {
      uint32_t first = 0;
      if (!read_at(data, buckets + uint64_t{b} * sizeof(uint32_t), first)) return std::nullopt;
      last = std::max(last, first);
    }
    if (last < head[1]) return head[1];  // no symbol is hashed: only those below symoffset
    for (uint64_t i = last;; ++i) {  // ends at the chain's last entry, or at the end of the file
      uint32_t entry = 0;
      if (!read_at(data, chains + (i - head[1]) * sizeof(uint32_t), entry)) return std::nullopt;
      if (entry & 1) return i + 1;
    }
  }
  if (hash != 0) {
    const auto at = file_range(segments, hash);
    uint32_t head[2];  // nbucket, nchain
    if (!at || !read_at(data, at->first, head)) return std::nullopt;
    return head[1];
  }
  return std::nullopt;
}

// Reads the dynamic symbol table as the dynamic loader finds it, without section headers: from
// PT_DYNAMIC's DT_SYMTAB, DT_STRTAB and DT_STRSZ, counted by its hash table. False when the file
// has no readable dynamic segment (find_dynsym() may still find the table by its section).
bool find_dynamic_symbols(const std::string& data, const std::vector<Elf64_Phdr>& segments,
                          const std::string& wanted, ElfFacts& facts) {
  const auto dynamic = std::find_if(segments.begin(), segments.end(),
                                    [](const Elf64_Phdr& p) { return p.p_type == PT_DYNAMIC; });
  if (dynamic == segments.end()) return false;
  // DT_STRSZ is not read: the loader does not bound names by it, and a size cut short of some
  // names would hide their symbols from the checks. A name is bounded by its segment.
  uint64_t symtab = 0, strtab = 0, syment = sizeof(Elf64_Sym), hash = 0, gnu_hash = 0;
  for (uint64_t i = 0; i < dynamic->p_filesz / sizeof(Elf64_Dyn); ++i) {
    Elf64_Dyn entry{};
    if (!read_at(data, dynamic->p_offset + i * sizeof(Elf64_Dyn), entry) || entry.d_tag == DT_NULL)
      break;
    const uint64_t value = entry.d_un.d_val;
    switch (entry.d_tag) {
      case DT_SYMTAB:
        symtab = value;
        break;
      case DT_STRTAB:
        strtab = value;
        break;
      case DT_SYMENT:
        syment = value;
        break;
      case DT_HASH:
        hash = value;
        break;
      case DT_GNU_HASH:
        gnu_hash = value;
        break;
      default:
        break;
    }
  }
  if (syment != sizeof(Elf64_Sym)) return false;
  const auto symbols = file_range(segments, symtab);
  const auto strings = file_range(segments, strtab);
  const std::optional<uint64_t> count = symbol_count(data, segments, gnu_hash, hash);
  if (!symbols || !strings || !count) return false;
  // As sections, so that scan_symbols() reads them; each bounded by its segment's file image.
  Elf64_Shdr dynsym{};
  dynsym.sh_offset = symbols->first;
  dynsym.sh_size = std::min(*count * sizeof(Elf64_Sym), symbols->second);
  dynsym.sh_entsize = sizeof(Elf64_Sym);
  Elf64_Shdr dynstr{};
  dynstr.sh_offset = strings->first;
  dynstr.sh_size = strings->second;
  facts.has_dynsym = true;
  scan_symbols(data, dynsym, dynstr, wanted, facts);
  return true;
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
  if (!facts.problem.empty()) return facts;
  const std::vector<Elf64_Phdr> segments = program_headers(data, header);
  facts.problem = truncation(data, header, segments);
  if (!facts.problem.empty()) return facts;
  if (!find_dynamic_symbols(data, segments, symbol, facts))
    find_dynsym(data, header, symbol, facts);
  return facts;
}

}  // namespace backhaul::validate
