// The extension is compiled as this one translation unit: parsing the ATen and dispatcher
// headers dominates compile time, so one unit builds in about a third of the time of five on a
// two-core machine. The included files stay separate, one job each.
#include "alias.cpp"
#include "api.cpp"
#include "costing.cpp"
#include "device.cpp"
#include "fallback.cpp"
#include "kernels.cpp"
#include "quirks.cpp"
