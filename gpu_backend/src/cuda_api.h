// Private alias of the CUDA device interface for the backend's sources.
#pragma once
#include "distplan/gpu_backend/cuda.h"
