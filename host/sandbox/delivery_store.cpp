#include "host/sandbox/delivery_store.h"

#include <algorithm>

namespace backhaul::sandbox {

DeliveryStore::DeliveryStore(const DataModel& data)
    : data_(data), tallies_(static_cast<size_t>(data.installations()) + 1) {}

int DeliveryStore::attribute(std::optional<DataModel::DeliveryOwner> owner,
                             const Webhook& hook) const {
  if (owner) return owner->installation;
  // Accept both the connection id ("gh-inst-1") and a bare installation id ("inst-1").
  if (auto connection = data_.find_connection(hook.connection_id)) return connection->installation;
  return data_.parse_installation_id(hook.connection_id).value_or(0);
}

bool DeliveryStore::misdirected(const DataModel::DeliveryOwner& owner, Provider provider,
                                const Webhook& hook) const {
  // The org is not checked: a run may name its own (`orgId`), which the daemon then sends.
  if (provider != owner.provider) return true;
  if (auto connection = data_.find_connection(hook.connection_id)) {
    return connection->installation != owner.installation || connection->provider != provider;
  }
  return data_.parse_installation_id(hook.connection_id) != owner.installation;
}

DeliveryStore::Outcome DeliveryStore::record(Provider provider, const Webhook& hook) {
  const auto owner = data_.classify_delivery(hook.delivery_id);  // pure; outside the lock
  const int installation = attribute(owner, hook);
  const bool astray = owner && misdirected(*owner, provider, hook);
  const size_t p = provider_index(provider);
  std::lock_guard lock(mutex_);
  DeliveryTally& tally = tallies_[static_cast<size_t>(installation)][p];
  ++tally.received;
  if (!received_.insert(hook.delivery_id).second) {
    ++tally.duplicates;
    return Outcome::kDuplicate;
  }
  ++tally.unique;
  ++event_types_[{installation, hook.event_type}][p];
  if (owner) {
    // Matched against the provider the id names, so missing = expected - matched stays exact
    // even if an id is posted under the wrong provider path.
    DeliveryTally& own =
        tallies_[static_cast<size_t>(installation)][provider_index(owner->provider)];
    ++own.matched;
    if (astray) {
      ++own.misdirected;
      if (misdirected_sample_.size() < kSampleSize) {
        misdirected_sample_.emplace_back(installation, hook.delivery_id);
      }
    }
  } else {
    ++tally.unexpected;
    if (unexpected_sample_.size() < kSampleSize) {
      unexpected_sample_.emplace_back(installation, hook.delivery_id);
    }
  }
  return Outcome::kAccepted;
}

void DeliveryStore::count_invalid() {
  std::lock_guard lock(mutex_);
  ++invalid_;
}

DeliveryStore::Summary DeliveryStore::summarize(std::optional<int> installation) const {
  Summary summary;
  std::lock_guard lock(mutex_);
  for (size_t i = 0; i < tallies_.size(); ++i) {
    if (installation && static_cast<size_t>(*installation) != i) continue;
    for (size_t p = 0; p < 2; ++p) {
      const DeliveryTally& from = tallies_[i][p];
      DeliveryTally& to = summary.by_provider[p];
      to.received += from.received;
      to.unique += from.unique;
      to.duplicates += from.duplicates;
      to.matched += from.matched;
      to.unexpected += from.unexpected;
      to.misdirected += from.misdirected;
    }
  }
  for (const auto& [key, counts] : event_types_) {
    if (installation && key.first != *installation) continue;
    for (size_t p = 0; p < 2; ++p) {
      if (counts[p] > 0) summary.event_types[p][key.second] += counts[p];
    }
  }
  for (const auto& [owner, id] : unexpected_sample_) {
    if (!installation || owner == *installation) summary.unexpected_sample.push_back(id);
  }
  for (const auto& [owner, id] : misdirected_sample_) {
    if (!installation || owner == *installation) summary.misdirected_sample.push_back(id);
  }
  summary.invalid = installation ? 0 : invalid_;
  return summary;
}

std::vector<std::string> DeliveryStore::missing(std::optional<int> installation,
                                                size_t limit) const {
  std::vector<std::string> result;
  for (int i = 1; i <= data_.installations() && result.size() < limit; ++i) {
    if (installation && *installation != i) continue;
    data_.for_each_expected(i, [&](const std::string& id, Provider) {
      if (result.size() >= limit) return;
      // Locked id by id, not for the walk: a walk of a large data set under the lock held every
      // webhook POST meanwhile, long enough for their senders to time out and send again.
      std::lock_guard lock(mutex_);
      if (!received_.contains(id)) result.push_back(id);
    });
  }
  return result;
}

void DeliveryStore::keep_sample(Provider provider, std::string_view body) {
  const size_t p = provider_index(provider);
  if (sampled_[p].load(std::memory_order_relaxed)) return;
  std::lock_guard lock(mutex_);
  if (samples_[p]) return;
  samples_[p] = std::string(body);
  sampled_[p] = true;
}

std::optional<std::string> DeliveryStore::sample(Provider provider) const {
  std::lock_guard lock(mutex_);
  return samples_[provider_index(provider)];
}

void DeliveryStore::reset() {
  std::lock_guard lock(mutex_);
  for (size_t p = 0; p < samples_.size(); ++p) {
    samples_[p].reset();
    sampled_[p] = false;
  }
  received_.clear();
  std::fill(tallies_.begin(), tallies_.end(), std::array<DeliveryTally, 2>{});
  event_types_.clear();
  unexpected_sample_.clear();
  misdirected_sample_.clear();
  invalid_ = 0;
}

}  // namespace backhaul::sandbox
