#include "core/common/logging.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include <spdlog/cfg/env.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

#include "core/common/redact.h"

namespace backhaul::logging {
namespace {

// Redacts every message before the wrapped sink formats it, so no logger, plugin or library can
// write a token by accident. Formats and writes to stderr.
class RedactingSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit RedactingSink(std::shared_ptr<spdlog::sinks::sink> inner) : inner_(std::move(inner)) {}

  // In JSON mode the pattern puts the message inside a JSON string, so it must be escaped here.
  void set_json(bool json) { json_ = json; }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    std::string_view text(msg.payload.data(), msg.payload.size());
    bool secret = contains_secret(text);
    if (!secret && !json_) {
      inner_->log(msg);
      return;
    }
    std::string clean = secret ? redact(text) : std::string(text);
    if (json_) clean = json_escape(clean);
    spdlog::details::log_msg copy(msg.time, msg.source, msg.logger_name, msg.level, clean);
    copy.thread_id = msg.thread_id;
    inner_->log(copy);
  }
  void flush_() override { inner_->flush(); }
  void set_pattern_(const std::string& pattern) override { inner_->set_pattern(pattern); }
  void set_formatter_(std::unique_ptr<spdlog::formatter> formatter) override {
    inner_->set_formatter(std::move(formatter));
  }

 private:
  static std::string json_escape(std::string_view in) {
    std::string out;
    out.reserve(in.size() + 8);
    for (char c : in) {
      switch (c) {
        case '"':
          out += "\\\"";
          break;
        case '\\':
          out += "\\\\";
          break;
        case '\n':
          out += "\\n";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            out += buf;
          } else {
            out += c;
          }
      }
    }
    return out;
  }

  std::shared_ptr<spdlog::sinks::sink> inner_;
  std::atomic<bool> json_{false};
};

constexpr const char* kTextPattern = "%Y-%m-%dT%H:%M:%S.%eZ %^%l%$ [%n] %v";
// JSON lines; RedactingSink escapes the message.
constexpr const char* kJsonPattern =
    R"({"ts":"%Y-%m-%dT%H:%M:%S.%eZ","level":"%l","logger":"%n","msg":"%v"})";

struct State {
  std::mutex mutex;
  std::shared_ptr<RedactingSink> sink;
  spdlog::level::level_enum level = spdlog::level::info;
  Format format = Format::kText;
};

State& state() {
  static State s;
  return s;
}

std::shared_ptr<RedactingSink> make_sink() {
  auto inner = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  auto sink = std::make_shared<RedactingSink>(inner);
  sink->set_pattern(kTextPattern);
  return sink;
}

}  // namespace

void configure(Format format, std::string_view level) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  if (!s.sink) s.sink = make_sink();
  s.format = format;
  s.sink->set_json(format == Format::kJson);
  s.level = spdlog::level::from_str(std::string(level));
  // UTC timestamps, so lines from several hosts sort together.
  s.sink->set_formatter(std::make_unique<spdlog::pattern_formatter>(
      format == Format::kJson ? kJsonPattern : kTextPattern, spdlog::pattern_time_type::utc));
  spdlog::set_level(s.level);
  spdlog::apply_all([&](const std::shared_ptr<spdlog::logger>& l) { l->set_level(s.level); });
  spdlog::cfg::load_env_levels();
}

std::shared_ptr<spdlog::logger> get(const std::string& name) {
  if (auto existing = spdlog::get(name)) return existing;
  State& s = state();
  std::lock_guard lock(s.mutex);
  if (auto existing = spdlog::get(name)) return existing;
  if (!s.sink) s.sink = make_sink();
  auto logger = std::make_shared<spdlog::logger>(name, s.sink);
  logger->set_level(s.level);
  spdlog::register_logger(logger);
  return logger;
}

}  // namespace backhaul::logging
