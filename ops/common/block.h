// The one block shape of every device body, so the megakernel can call any of them.
#pragma once

namespace encore {

inline constexpr int kBlockThreads = 256;
inline constexpr int kWarpsPerBlock = kBlockThreads / 32;

}  // namespace encore
