// What the fake gateway received: every delivery id once (later copies are duplicates), tallied
// per installation and provider against the ids the data set implies. Payloads are not kept, so
// memory stays proportional to the number of distinct ids. [thread-safe]
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "host/sandbox/data.h"

namespace backhaul::sandbox {

struct Webhook {
  std::string connection_id;
  std::string org_id;
  std::string delivery_id;
  std::string event_type;
};

struct DeliveryTally {
  int64_t received = 0;    // accepted posts, duplicates included
  int64_t unique = 0;      // distinct delivery ids
  int64_t duplicates = 0;  // posts of an id already received
  int64_t matched = 0;     // distinct ids the data set implies
  int64_t unexpected = 0;  // distinct ids it does not
  // distinct ids it implies that came under the other provider's path, or with a connection that
  // is not their installation's
  int64_t misdirected = 0;
};

class DeliveryStore {
 public:
  explicit DeliveryStore(const DataModel& data);

  enum class Outcome { kAccepted = 1, kDuplicate };
  // Records a valid webhook posted to /gateway/webhooks/{provider}.
  Outcome record(Provider provider, const Webhook& hook);
  void count_invalid();

  struct Summary {
    std::array<DeliveryTally, 2> by_provider{};  // indexed by provider_index()
    std::array<std::map<std::string, int64_t>, 2> event_types;
    int64_t invalid = 0;
    std::vector<std::string> unexpected_sample;   // the first few unexpected ids
    std::vector<std::string> misdirected_sample;  // the first few misdirected ids
  };
  // Totals over all installations (and unattributable ids), or over one installation.
  Summary summarize(std::optional<int> installation) const;

  // Up to `limit` expected ids not received yet, for one installation or all, in data order. Not
  // a snapshot: ids received during the call may or may not be among them.
  std::vector<std::string> missing(std::optional<int> installation, size_t limit) const;

  // The first accepted body per provider, kept verbatim: a representative event for load tools
  // (the pipeline benchmark posts it with wrk to measure the gateway's raw rate on real events).
  void keep_sample(Provider provider, std::string_view body);
  std::optional<std::string> sample(Provider provider) const;

  void reset();

 private:
  static constexpr size_t kSampleSize = 20;

  // The installation an id belongs to: from its own text, else from the connection; 0 if neither.
  int attribute(std::optional<DataModel::DeliveryOwner> owner, const Webhook& hook) const;
  // Whether an id of `owner` came under another provider's path or connection.
  bool misdirected(const DataModel::DeliveryOwner& owner, Provider provider,
                   const Webhook& hook) const;

  const DataModel& data_;
  mutable std::mutex mutex_;
  std::unordered_set<std::string> received_;
  // [installation][provider_index()]; slot 0 collects ids no installation claims.
  std::vector<std::array<DeliveryTally, 2>> tallies_;
  std::map<std::pair<int, std::string>, std::array<int64_t, 2>> event_types_;
  std::vector<std::pair<int, std::string>> unexpected_sample_;
  std::vector<std::pair<int, std::string>> misdirected_sample_;
  int64_t invalid_ = 0;
  std::array<std::optional<std::string>, 2> samples_;
  std::array<std::atomic<bool>, 2> sampled_{};  // samples_[p] is set (checked without the lock)
};

}  // namespace backhaul::sandbox
