// Reads a plugin file's ELF header and dynamic symbol table without loading it: the static checks
// that need no plugin code at all (not even its constructors) run on this.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace backhaul::validate {

struct ElfSymbol {
  uint64_t size = 0;
  bool defined = false;    // st_shndx != SHN_UNDEF
  bool global = false;     // STB_GLOBAL, STB_WEAK or STB_GNU_UNIQUE
  bool visible = false;    // STV_DEFAULT or STV_PROTECTED
  bool is_object = false;  // STT_OBJECT (data, not a function)
};

struct ElfFacts {
  // Empty when the file is an ELF shared object this host can load; else why not.
  std::string problem;
  // Whether the dynamic symbol table could be read: through the dynamic segment, as the loader
  // finds it, or else its section.
  bool has_dynsym = false;
  std::optional<ElfSymbol> entry;            // the symbol named `symbol`, if present
  std::vector<std::string> exported_sample;  // a few other defined global symbols (for hints)
  size_t exported_others = 0;                // how many of those there are in all
};

// Never throws for a bad file (that is what `problem` is for); bounds-checks every offset, as the
// file may be anything.
ElfFacts inspect_elf(const std::filesystem::path& path, const std::string& symbol);

}  // namespace backhaul::validate
