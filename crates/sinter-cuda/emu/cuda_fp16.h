// Emulator stand-in for <cuda_fp16.h>: everything lives in cuda_emu.h.
#pragma once
#include "cuda_emu.h"
