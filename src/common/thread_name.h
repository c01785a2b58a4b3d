// Names the runtime's own threads, so that top -H, /proc/<pid>/task/*/comm,
// perf and gdb tell them from the trainer's (and from each other): what each
// costs a host, and a guest on its cores, is then measurable per thread.
// Private to omni_core.
//
// Thread safety: names the calling thread only.
#pragma once

#include <pthread.h>

namespace omni::internal {

// `name`: at most 15 characters (the kernel's limit; longer names are cut).
inline void NameThisThread(const char* name) {
  char cut[16] = {};
  for (int i = 0; i < 15 && name[i] != '\0'; ++i) cut[i] = name[i];
  pthread_setname_np(pthread_self(), cut);
}

}  // namespace omni::internal
