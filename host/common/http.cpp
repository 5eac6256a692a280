#include "host/common/http.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <istream>
#include <ostream>

#include <Poco/Net/HTTPServerRequest.h>
#include <Poco/Net/HTTPServerResponse.h>

namespace backhaul::host {
namespace {

constexpr size_t kMaxDrainBytes = 1024 * 1024;

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

}  // namespace

Query Query::parse(std::string_view raw_query) {
  Query query;
  while (!raw_query.empty()) {
    size_t amp = raw_query.find('&');
    std::string_view pair = raw_query.substr(0, amp);
    raw_query = amp == std::string_view::npos ? std::string_view{} : raw_query.substr(amp + 1);
    if (pair.empty()) continue;
    size_t eq = pair.find('=');
    std::string_view key = pair.substr(0, eq);
    std::string_view value =
        eq == std::string_view::npos ? std::string_view{} : pair.substr(eq + 1);
    query.params_.push_back(
        {percent_decode(key, true), percent_decode(value, true), std::string(pair)});
  }
  return query;
}

std::optional<std::string> Query::get(std::string_view key) const {
  for (const Param& param : params_) {
    if (param.key == key) return param.value;
  }
  return std::nullopt;
}

std::vector<std::string> Query::names() const {
  std::vector<std::string> names;
  for (const Param& param : params_) names.push_back(param.key);
  return names;
}

std::string Query::raw_without(std::string_view skip_key) const {
  std::string out;
  for (const Param& param : params_) {
    if (param.key == skip_key) continue;
    if (!out.empty()) out += '&';
    out += param.raw;
  }
  return out;
}

const std::string* Request::header(const std::string& lower_case_name) const {
  auto it = headers.find(lower_case_name);
  return it == headers.end() ? nullptr : &it->second;
}

const std::string* Response::find_header(std::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (key == name) return &value;
  }
  return nullptr;
}

Response json_response(int status, const nlohmann::json& body) {
  Response response;
  response.status = status;
  // Text from outside (a stored error cut mid-character, a %FF in the path) may not be UTF-8: it
  // is shown with the bad bytes replaced rather than failing the whole answer.
  response.body = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return response;
}

std::vector<std::string_view> split_path(std::string_view path) {
  std::vector<std::string_view> segments;
  if (!path.empty() && path.front() == '/') path.remove_prefix(1);
  if (path.empty()) return segments;
  while (true) {
    size_t slash = path.find('/');
    segments.push_back(path.substr(0, slash));
    if (slash == std::string_view::npos) break;
    path.remove_prefix(slash + 1);
  }
  return segments;
}

std::vector<std::string_view> path_segments(const Request& request) {
  if (request.segments.empty()) return split_path(request.path);
  return {request.segments.begin(), request.segments.end()};
}

std::string_view raw_segment(const Request& request, std::string_view segment) {
  // By identity, not by value: "1" and "%31" may both be in the path.
  for (size_t i = 0; i < request.segments.size(); ++i) {
    if (request.segments[i].data() != segment.data()) continue;
    const std::vector<std::string_view> raw = split_path(request.raw_path);
    return raw.size() == request.segments.size() ? raw[i] : segment;
  }
  return segment;
}

std::string percent_decode(std::string_view text, bool plus_is_space) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == '%' && i + 2 < text.size()) {
      int hi = hex_value(text[i + 1]);
      int lo = hex_value(text[i + 2]);
      if (hi >= 0 && lo >= 0) {
        out += static_cast<char>(hi * 16 + lo);
        i += 2;
        continue;
      }
    }
    out += (c == '+' && plus_is_space) ? ' ' : c;
  }
  return out;
}

std::optional<int64_t> parse_int(std::string_view text) {
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  int64_t value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc{} || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return value;
}

Request read_request(Poco::Net::HTTPServerRequest& in, size_t max_body_bytes) {
  Request request;
  request.method = in.getMethod();
  const std::string& uri = in.getURI();
  const size_t question = uri.find('?');
  const std::string_view raw_path = std::string_view(uri).substr(0, question);
  request.path = percent_decode(raw_path, false);
  request.raw_path = raw_path;
  for (std::string_view segment : split_path(raw_path)) {
    request.segments.push_back(percent_decode(segment, false));
  }
  if (question != std::string::npos) {
    request.query = Query::parse(std::string_view(uri).substr(question + 1));
  }
  size_t lengths = 0;
  for (const auto& [name, value] : in) {
    std::string key = lower(name);
    lengths += key == "content-length";
    request.headers[std::move(key)] = value;
  }
  if (raw_path.empty() || raw_path.front() != '/') {
    throw std::runtime_error("request target: must begin with '/' (got \"" +
                             std::string(raw_path.substr(0, 100)) + "\")");
  }
  // Poco frames the body by the first; a proxy in front may take the last, and read what follows
  // as a request of its own (request smuggling).
  if (lengths > 1) {
    throw std::runtime_error("headers: Content-Length is given " + std::to_string(lengths) +
                             " times");
  }
  // A malformed chunk size ends Poco's chunked stream as a clean end of body: the body would
  // read as a valid shorter one (empty, asking for every default) and the bytes after it as the
  // next request. Every client of these servers sends a length.
  if (in.getChunkedTransferEncoding()) {
    throw std::runtime_error(
        "body: chunked transfer encoding is not accepted; send Content-Length");
  }
  if (!in.hasContentLength()) return request;
  if (in.getContentLength64() < 0) {
    throw std::runtime_error("body: Content-Length " + std::to_string(in.getContentLength64()) +
                             " is negative");
  }
  std::istream& body = in.stream();
  char buffer[16 * 1024];
  const int64_t length = in.getContentLength64();
  if (length <= static_cast<int64_t>(max_body_bytes)) {
    while (body && request.body.size() <= max_body_bytes) {
      body.read(buffer, sizeof buffer);
      request.body.append(buffer, static_cast<size_t>(body.gcount()));
    }
    // A body cut short (the client stopped sending: a read timeout, a reset, its end before the
    // length it announced) is no request: read as a whole it could be a valid, shorter one (an
    // empty body, say, asking for every default).
    // After a failed read (a timeout, a reset), what it had read before failing is not counted:
    // no count is given then.
    if (body.bad()) {
      throw std::runtime_error("body: cut off before the " + std::to_string(length) +
                               " bytes announced arrived (the connection failed or timed out)");
    }
    if (static_cast<int64_t>(request.body.size()) < length) {
      throw std::runtime_error("body: ended after " + std::to_string(request.body.size()) + " of " +
                               std::to_string(length) + " bytes");
    }
    if (request.body.size() <= max_body_bytes) return request;
    request.body.resize(max_body_bytes);
  }
  request.body_too_large = true;
  // Swallow a modest excess so the client, still sending, reads the 413 instead of a reset
  // connection; a larger one is cut off when the connection closes.
  size_t drained = 0;
  while (body && drained < kMaxDrainBytes) {
    body.read(buffer, sizeof buffer);
    drained += static_cast<size_t>(body.gcount());
  }
  return request;
}

void write_response(const Response& response, Poco::Net::HTTPServerResponse& out) {
  out.setStatusAndReason(static_cast<Poco::Net::HTTPResponse::HTTPStatus>(response.status));
  out.setContentType(response.content_type);
  for (const auto& [name, value] : response.headers) out.add(name, value);
  if (response.status == 413) out.setKeepAlive(false);
  out.setContentLength64(static_cast<Poco::Int64>(response.body.size()));
  out.setChunkedTransferEncoding(false);
  // Flushed here, not when Poco destroys the response: the answer is on the socket when this
  // returns (a stop waiting for it then closes the connection). No body for HEAD (Poco's stream).
  std::ostream& stream = out.send();
  stream.write(response.body.data(), static_cast<std::streamsize>(response.body.size()));
  stream.flush();
}

}  // namespace backhaul::host
