#ifndef TRAINYARD_TESTS_COMMON_FLIGHT_RECORD_QUERIES_H_
#define TRAINYARD_TESTS_COMMON_FLIGHT_RECORD_QUERIES_H_

// What tests ask of a flight record (common/flight_record.h): the highest collective number in
// it, and per peer the highest message numbers sent to and received from it (0: none), as far
// as its entries reach back.

#include <cstdint>

#include "common/flight_record.h"

namespace trainyard {

template <typename Match>
int64_t LastMatching(const FlightRecordSnapshot& r, Match match) {
  int64_t last = 0;
  for (const CollectiveEntry& e : r.recent) {
    if (match(e) && e.seq > last) last = e.seq;
  }
  return last;
}
inline int64_t LastCollective(const FlightRecordSnapshot& r) {
  return LastMatching(r, [](const CollectiveEntry& e) { return e.peer < 0; });
}
inline int64_t LastSent(const FlightRecordSnapshot& r, int peer) {
  return LastMatching(r, [peer](const CollectiveEntry& e) {
    return e.kind == CollectiveKind::kSend && e.peer == peer;
  });
}
inline int64_t LastReceived(const FlightRecordSnapshot& r, int peer) {
  return LastMatching(r, [peer](const CollectiveEntry& e) {
    return e.kind == CollectiveKind::kRecv && e.peer == peer;
  });
}

}  // namespace trainyard

#endif  // TRAINYARD_TESTS_COMMON_FLIGHT_RECORD_QUERIES_H_
