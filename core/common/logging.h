// spdlog set-up: one logger per subsystem, every line passed through redact().
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <spdlog/spdlog.h>

namespace backhaul::logging {

enum class Format { kText = 1, kJson };

// Configures the process-wide sink (stderr), format and level ("info", "debug", ...). Levels per
// logger can also come from SPDLOG_LEVEL (e.g. "info,plugins=debug"). Call once from main();
// loggers created before keep working. [main-thread]
void configure(Format format, std::string_view level);

// The logger named `name` ("plugins", "http", "plugin.github", ...), created on first use with the
// shared redacting sink. [thread-safe]
std::shared_ptr<spdlog::logger> get(const std::string& name);

}  // namespace backhaul::logging
