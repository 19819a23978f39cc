// Emulator stand-in for <cuda_runtime.h>: everything lives in cuda_emu.h.
#pragma once
#include "cuda_emu.h"
