#include <encore/status.h>

namespace encore {

const char* to_string(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kNullPointer: return "null pointer";
    case StatusCode::kMisaligned: return "misaligned pointer";
    case StatusCode::kOverlap: return "overlapping buffers";
    case StatusCode::kOutOfRange: return "out of range";
    case StatusCode::kUnsupported: return "unsupported";
    case StatusCode::kCudaError: return "CUDA error";
    case StatusCode::kNoDevice: return "no CUDA device";
    case StatusCode::kInvalidFile: return "invalid file";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  return std::string("encore: ") + encore::to_string(code_) + ": " + message_;
}

}  // namespace encore
