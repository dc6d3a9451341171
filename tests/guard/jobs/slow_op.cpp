// A real C++ extension whose compilation takes a while (a constexpr loop the compiler evaluates).
#include <Python.h>
#ifndef ZP_SPIN
#define ZP_SPIN 20000000UL
#endif
constexpr unsigned long spin() { unsigned long s = 0; for (unsigned long i = 0; i < ZP_SPIN; ++i) s += (i * i) % 7; return s; }
static constexpr unsigned long kSpin = spin();
static PyObject* value(PyObject*, PyObject*) { return PyLong_FromUnsignedLong(kSpin); }
static PyMethodDef methods[] = {{"value", value, METH_NOARGS, nullptr}, {nullptr, nullptr, 0, nullptr}};
static PyModuleDef mod = {PyModuleDef_HEAD_INIT, "zp_slow_op", nullptr, -1, methods};
PyMODINIT_FUNC PyInit_zp_slow_op(void) { return PyModule_Create(&mod); }
