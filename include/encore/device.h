// Small device queries for applications and test harnesses.
#pragma once

#include <string>

namespace encore {

// True when at least one CUDA device can be used; `why` gets a one-line reason otherwise.
bool cuda_device_available(std::string* why = nullptr);

}  // namespace encore
