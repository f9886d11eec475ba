#ifndef TRAINYARD_TESTS_COMMON_PROMETHEUS_TEXT_H_
#define TRAINYARD_TESTS_COMMON_PROMETHEUS_TEXT_H_

// Reading metrics the way Prometheus would, for tests of the metrics collectors.

#include <cmath>
#include <sstream>
#include <string>

#include "absl/strings/numbers.h"
#include "prometheus/collectable.h"
#include "prometheus/text_serializer.h"

namespace trainyard {

// The text exposition format of everything `collectable` exports now.
inline std::string Scrape(const prometheus::Collectable& collectable) {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, collectable.Collect());
  return out.str();
}

// The value of the sample whose name and labels are exactly `series` (as printed, e.g.
// `trainyard_jobs{state="running"}`); NaN when absent.
inline double Value(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(series + " ", 0) != 0) continue;
    double value = 0;
    std::string rest = line.substr(series.size() + 1);
    rest = rest.substr(0, rest.find(' '));  // drop a timestamp if any
    if (absl::SimpleAtod(rest, &value)) return value;
  }
  return std::nan("");
}

}  // namespace trainyard

#endif  // TRAINYARD_TESTS_COMMON_PROMETHEUS_TEXT_H_
