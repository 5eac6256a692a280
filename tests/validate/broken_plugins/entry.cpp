// The entry of one reference-connector plugin. REFERENCE_DEFECT names its defect (a
// reference::Defect enumerator, default kNone); the defects that live below the C++ layer also
// swap functions in the entry below.
#include "reference_connector.h"

#ifndef REFERENCE_DEFECT
#define REFERENCE_DEFECT kNone
#endif

const reference::Defect reference::kDefect = reference::Defect::REFERENCE_DEFECT;

namespace {

using reference::Defect;
using reference::Trampolines;

constexpr Defect kThis = Defect::REFERENCE_DEFECT;

constexpr auto kValidateConfig = kThis == Defect::kSegvAlways ? &reference::crash_validate_config
                                                              : &Trampolines::validate_config;
constexpr auto kCreate =
    kThis == Defect::kSegvAlways ? &reference::crash_create : &Trampolines::create;
constexpr auto kValidateScopes = kThis == Defect::kSegvAlways ? &reference::crash_validate_scopes
                                                              : &Trampolines::validate_scopes;

constexpr backhaul_status_t (*fetch_page_function())(backhaul_instance_t*,
                                                     const backhaul_fetch_request_t*,
                                                     backhaul_page_t**, backhaul_error_t*) {
  switch (kThis) {
    case Defect::kSegvAlways:
      return &reference::crash_fetch_page;
    case Defect::kReusesPage:
      return &reference::reusing_fetch_page;
    case Defect::kThrows:
      return &reference_throwing_fetch_page;
    case Defect::kShortPage:
      return &reference::short_fetch_page;
    default:
      return &Trampolines::fetch_page;
  }
}

constexpr void (*release_page_function())(backhaul_instance_t*, backhaul_page_t*) {
  switch (kThis) {
    case Defect::kLeaksPage:
      return &reference::leaky_release_page;
    case Defect::kReusesPage:
      return &reference::reusing_release_page;
    case Defect::kShortPage:
      return &reference::short_release_page;
    default:
      return &Trampolines::release_page;
  }
}

constexpr uint16_t kAbiMajor = kThis == Defect::kWrongAbi ? 2 : BACKHAUL_ABI_VERSION_MAJOR;

}  // namespace

#ifdef REFERENCE_NO_ENTRY
// Same object, another name: the version script keeps it local, so nothing is exported.
#define REFERENCE_ENTRY_SYMBOL reference_entry_not_exported
#else
#define REFERENCE_ENTRY_SYMBOL backhaul_entry
#endif

#ifdef REFERENCE_EXTRA_EXPORT
// Built without the SDK's version script: this is exported besides the entry, as every function of
// a plugin linked without one is.
extern "C" BACKHAUL_EXPORT int reference_extra_export() { return 1; }
#endif

extern "C" BACKHAUL_EXPORT const backhaul_entry_t REFERENCE_ENTRY_SYMBOL = {
    sizeof(backhaul_entry_t),
    {kAbiMajor, BACKHAUL_ABI_VERSION_MINOR},
    BACKHAUL_MAGIC_INIT,
    &reference::kDescriptor,
    &Trampolines::init,
    &Trampolines::deinit,
    kValidateConfig,
    kCreate,
    &Trampolines::destroy,
    kValidateScopes,
    fetch_page_function(),
    release_page_function(),
    &Trampolines::get_extension};
