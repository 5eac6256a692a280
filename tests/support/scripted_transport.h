// A Transport that answers with queued responses in order and records every request it performs,
// for tests of what is built on a transport (send()'s redirects, the gateway client).
#pragma once

#include <deque>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/http/http.h"

namespace backhaul::testing {

class ScriptedTransport final : public http::Transport {
 public:
  void then(int status, http::Headers headers = {}, std::string body = {}) {
    http::Response r;
    r.status = status;
    r.headers = std::move(headers);
    r.body = std::move(body);
    script_.push_back(std::move(r));
  }
  void then_redirect(int status, std::string location) {
    then(status, {{"location", std::move(location)}});
  }

  http::Response perform(const http::Request& request) override {
    requests.push_back(request);
    if (script_.empty()) throw std::logic_error("unexpected request to " + request.url);
    http::Response r = std::move(script_.front());
    script_.pop_front();
    r.url = request.url;
    return r;
  }

  std::vector<http::Request> requests;

 private:
  std::deque<http::Response> script_;
};

// The first value of header `name` (case-insensitive) in `r`.
inline std::optional<std::string> header_of(const http::Request& r, std::string_view name) {
  for (const auto& [k, v] : r.headers) {
    if (http::to_lower(k) == http::to_lower(name)) return v;
  }
  return std::nullopt;
}

}  // namespace backhaul::testing
