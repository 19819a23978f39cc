// Emulator stand-in for <mma.h>: everything lives in cuda_emu.h.
#pragma once
#include "cuda_emu.h"
