// encore::Status — how every public entry point reports bad input or a CUDA failure.
// Launchers validate first and return a non-ok Status without launching anything; callers that
// prefer exceptions wrap the call in encore::throw_if_error().
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace encore {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // a dimension, flag or value the op does not accept
  kNullPointer,      // a required pointer is null
  kMisaligned,       // a pointer or stride breaks the op's alignment contract
  kOverlap,          // an output aliases an input that other threads still read
  kOutOfRange,       // a batch, index or length outside its range or beyond a capacity (slots, pages, experts)
  kUnsupported,      // a configuration this build does not implement
  kCudaError,        // the CUDA runtime reported an error (stream failed, launch failed, ...)
  kNoDevice,         // no CUDA device is present
  kInvalidFile,      // a model file that cannot be read or is not what its format says
};

const char* to_string(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status success() { return {}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

class Error : public std::runtime_error {
 public:
  explicit Error(const Status& status) : std::runtime_error(status.to_string()), code_(status.code()) {}
  StatusCode code() const { return code_; }

 private:
  StatusCode code_;
};

inline void throw_if_error(const Status& status) {
  if (!status.ok()) throw Error(status);
}

namespace detail {
template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}
}  // namespace detail

}  // namespace encore

// Return a failed Status from the enclosing function when `cond` is false.
#define ENCORE_REQUIRE(cond, code, ...)                                                      \
  do {                                                                                        \
    if (!(cond)) return ::encore::Status((code), ::encore::detail::concat(__VA_ARGS__));      \
  } while (0)

#define ENCORE_RETURN_IF_ERROR(expr)            \
  do {                                          \
    ::encore::Status encore_status_ = (expr);   \
    if (!encore_status_.ok()) return encore_status_; \
  } while (0)
