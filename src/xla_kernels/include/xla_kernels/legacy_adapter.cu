// The CUDA twin of legacy_adapter.cc (nvcc compiles .cu files as CUDA): see that file.
#include "legacy_adapter.cc"
