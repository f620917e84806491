// The native timelines as another extension calls them, with no Python in between: the
// collective book asks a release time once per emulated message and is told of each
// real send, and a Python call for each is most of what a message costs it.
//
// `_timing` publishes one TimingApi in the capsule named kTimingApiCapsule; a caller
// imports it once (PyCapsule_Import) and asks `native_of` whether an object is one of
// these timelines. Plain C types: the two modules share no C++ ABI.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>

namespace nbx::timing {

constexpr const char* kTimingApiCapsule = "neuronabox.schedules._timing._api";
constexpr int kTimingApiVersion = 1;

struct TimingApi {
  int version;
  // The timeline behind `obj` (borrowed; valid while `obj` lives), or null when `obj` is
  // not a native timeline. `kind` says which, for the two calls below.
  void* (*native_of)(PyObject* obj, int* kind);
  double (*release)(void* timeline, int kind, int emu, int step);
  void (*real_sent)(void* timeline, int kind, int rank, int step, double t);
};

}  // namespace nbx::timing
