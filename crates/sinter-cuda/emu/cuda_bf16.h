// Emulator stand-in for <cuda_bf16.h>: everything lives in cuda_emu.h.
#pragma once
#include "cuda_emu.h"
