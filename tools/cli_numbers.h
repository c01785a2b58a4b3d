// Numeric values of the omni tool's flags (omni_cli.cc, plot.cc): the whole
// value must parse and lie in [lo, hi], with no silent wrap-around,
// saturation or out-of-range conversion. On failure, false and `err` naming
// the flag and the value. Pure functions.
#ifndef OMNI_TOOLS_CLI_NUMBERS_H_
#define OMNI_TOOLS_CLI_NUMBERS_H_

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace omni {

inline bool ParseInteger(const std::string& flag, const std::string& s, int64_t lo, int64_t hi,
                         int64_t& v, std::string& err) {
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(s.c_str(), &end, 10);
  if (end == s.c_str() || *end != '\0') {
    err = "not an integer for " + flag + ": '" + s + "'";
    return false;
  }
  if (errno == ERANGE || x < lo || x > hi) {
    err = flag + " " + s + " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) +
          "]";
    return false;
  }
  v = x;
  return true;
}

inline bool ParseReal(const std::string& flag, const std::string& s, double lo, double hi,
                      double& v, std::string& err) {
  char* end = nullptr;
  const double x = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || *end != '\0' || !std::isfinite(x)) {
    err = "not a number for " + flag + ": '" + s + "'";
    return false;
  }
  if (!(x >= lo && x <= hi)) {
    char range[64];
    std::snprintf(range, sizeof(range), "[%g, %g]", lo, hi);
    err = flag + " " + s + " is out of range " + range;
    return false;
  }
  v = x;
  return true;
}

}  // namespace omni

#endif  // OMNI_TOOLS_CLI_NUMBERS_H_
