// Python bindings of the native timing core: `RingTimeline`, the closed form the
// engine asks once per emulated message of a ring (timing.py builds it).
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>
#include <new>
#include <utility>
#include <vector>

#include "ring_timeline.h"

namespace {

using nbx::timing::RingParams;
using nbx::timing::RingTimeline;

struct RingObject {
  PyObject_HEAD
  RingTimeline* tl;
};

PyTypeObject RingType = {PyVarObject_HEAD_INIT(nullptr, 0)};

int ring_init(PyObject* obj, PyObject* args, PyObject* kwds) {
  static const char* kw[] = {"world", "real", "data_goes_down", "t0", "pace", "work", "modeled", "stragglers", nullptr};
  auto* self = reinterpret_cast<RingObject*>(obj);
  RingParams p;
  PyObject *real, *stragglers;
  int down = 1, modeled = 1;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "iOpdddpO!", const_cast<char**>(kw), &p.world, &real, &down, &p.t0,
                                   &p.pace, &p.work, &modeled, &PyDict_Type, &stragglers)) {
    return -1;
  }
  p.data_goes_down = down != 0;
  p.modeled = modeled != 0;
  PyObject* seq = PySequence_Fast(real, "real: a sequence of ranks");
  if (seq == nullptr) return -1;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  for (Py_ssize_t i = 0; i < n; ++i) {
    const long r = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
    if (r == -1 && PyErr_Occurred()) {
      Py_DECREF(seq);
      return -1;
    }
    if (r < 0 || r >= p.world || (!p.real.empty() && r <= p.real.back())) {
      Py_DECREF(seq);
      PyErr_Format(PyExc_ValueError, "real ranks must be sorted, distinct and in [0, %d)", p.world);
      return -1;
    }
    p.real.push_back(static_cast<int>(r));
  }
  Py_DECREF(seq);
  if (p.world <= 0 || p.real.empty()) {
    PyErr_SetString(PyExc_ValueError, "a ring timeline needs a positive world and a real rank");
    return -1;
  }
  PyObject *key, *value;
  Py_ssize_t pos = 0;
  while (PyDict_Next(stragglers, &pos, &key, &value)) {
    const long q = PyLong_AsLong(key);
    const double d = PyFloat_AsDouble(value);
    if (PyErr_Occurred()) return -1;
    p.stragglers.emplace_back(static_cast<int>(q), d);
  }
  delete self->tl;
  self->tl = new (std::nothrow) RingTimeline(std::move(p));
  if (self->tl == nullptr) {
    PyErr_NoMemory();
    return -1;
  }
  return 0;
}

void ring_dealloc(PyObject* obj) {
  delete reinterpret_cast<RingObject*>(obj)->tl;
  Py_TYPE(obj)->tp_free(obj);
}

RingTimeline* timeline_of(PyObject* obj) {
  RingTimeline* tl = reinterpret_cast<RingObject*>(obj)->tl;
  if (tl == nullptr) PyErr_SetString(PyExc_RuntimeError, "RingTimeline not initialized");
  return tl;
}

// (emu, step) from a fastcall's arguments.
bool two_ints(PyObject* const* args, Py_ssize_t n, int* a, int* b) {
  if (n != 2) {
    PyErr_SetString(PyExc_TypeError, "expected (rank, step)");
    return false;
  }
  *a = static_cast<int>(PyLong_AsLong(args[0]));
  *b = static_cast<int>(PyLong_AsLong(args[1]));
  return !PyErr_Occurred();
}

PyObject* ring_real_sent(PyObject* obj, PyObject* const* args, Py_ssize_t n) {
  RingTimeline* tl = timeline_of(obj);
  if (tl == nullptr) return nullptr;
  int rank, step;
  if (n != 3 || !two_ints(args, 2, &rank, &step)) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "real_sent(rank, step, t)");
    return nullptr;
  }
  const double t = PyFloat_AsDouble(args[2]);
  if (PyErr_Occurred()) return nullptr;
  tl->real_sent(rank, step, t);
  Py_RETURN_NONE;
}

template <double (RingTimeline::*Fn)(int, int)>
PyObject* ring_query(PyObject* obj, PyObject* const* args, Py_ssize_t n) {
  RingTimeline* tl = timeline_of(obj);
  int emu, step;
  if (tl == nullptr || !two_ints(args, n, &emu, &step)) return nullptr;
  return PyFloat_FromDouble((tl->*Fn)(emu, step));
}

PyObject* ring_boundary_cost(PyObject* obj, PyObject* const* args, Py_ssize_t n) {
  RingTimeline* tl = timeline_of(obj);
  int emu, step;
  if (tl == nullptr || !two_ints(args, n, &emu, &step)) return nullptr;
  return PyFloat_FromDouble(tl->boundary_cost());
}

PyMethodDef ring_methods[] = {
    {"real_sent", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(ring_real_sent)), METH_FASTCALL,
     "real_sent(rank, step, t): real `rank`'s boundary send of `step` reached the controller at t."},
    {"ready", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(ring_query<&RingTimeline::ready>)),
     METH_FASTCALL, "ready(emu, step): when emulated `emu` may send its message of `step`."},
    {"arrival", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(ring_query<&RingTimeline::arrival>)),
     METH_FASTCALL, "arrival(emu, step): when that message reaches its real peer."},
    {"release", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(ring_query<&RingTimeline::release>)),
     METH_FASTCALL, "release(emu, step): when the controller writes it."},
    {"boundary_cost", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(ring_boundary_cost)),
     METH_FASTCALL, "boundary_cost(emu, step): the boundary hop's modeled time (one pace)."},
    {nullptr, nullptr, 0, nullptr},
};

PyObject* get_param(PyObject* obj, void* which) {
  RingTimeline* tl = timeline_of(obj);
  if (tl == nullptr) return nullptr;
  const RingParams& p = tl->params();
  switch (reinterpret_cast<intptr_t>(which)) {
    case 0: return PyLong_FromLong(p.world);
    case 1: return PyFloat_FromDouble(p.t0);
    case 2: return PyFloat_FromDouble(p.pace);
    case 3: return PyFloat_FromDouble(p.work);
    default: return PyBool_FromLong(p.modeled);
  }
}

PyGetSetDef ring_getset[] = {
    {"world", get_param, nullptr, "ranks in the ring", reinterpret_cast<void*>(0)},
    {"t0", get_param, nullptr, "the emulated ranks' entry", reinterpret_cast<void*>(1)},
    {"pace", get_param, nullptr, "c: seconds per two steps", reinterpret_cast<void*>(2)},
    {"work", get_param, nullptr, "w: an emulated receiver's work per edge", reinterpret_cast<void*>(3)},
    {"modeled", get_param, nullptr, "whether the model prices the boundary hop", reinterpret_cast<void*>(4)},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_timing", "NeuronaBox's native timing core.", -1, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__timing(void) {
  RingType.tp_name = "neuronabox.schedules._timing.RingTimeline";
  RingType.tp_basicsize = sizeof(RingObject);
  RingType.tp_dealloc = ring_dealloc;
  RingType.tp_flags = Py_TPFLAGS_DEFAULT;
  RingType.tp_doc = "Release times of a ring's emulated messages: the closed form, per message.";
  RingType.tp_methods = ring_methods;
  RingType.tp_getset = ring_getset;
  RingType.tp_init = ring_init;
  RingType.tp_new = PyType_GenericNew;
  if (PyType_Ready(&RingType) < 0) return nullptr;
  PyObject* m = PyModule_Create(&module_def);
  if (m == nullptr) return nullptr;
  Py_INCREF(&RingType);
  if (PyModule_AddObject(m, "RingTimeline", reinterpret_cast<PyObject*>(&RingType)) < 0) {
    Py_DECREF(&RingType);
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
