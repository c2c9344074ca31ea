"""Which exceptions a signal raised: the group commit's writer, in the main thread, tells its own interrupt (a
signal's exception, which lands only there) from what another thread's work raised while it ran that work.

    installed = handler_codes()            # when the main thread begins a batch
    ...
    if signal_raised(exc, installed): ...  # the main thread's: the batch is rolled back, and it raises `exc`
"""

from __future__ import annotations

import functools
import inspect
import signal
from types import (
    BuiltinFunctionType,
    CodeType,
    FunctionType,
    MethodDescriptorType,
    MethodType,
    MethodWrapperType,
    WrapperDescriptorType,
)


def _opaque() -> None:
    """Stands, in `handler_codes`, for a handler whose code cannot be seen (one made in C)."""


OPAQUE = _opaque.__code__
_MADE_IN_C = (BuiltinFunctionType, MethodDescriptorType, MethodWrapperType, WrapperDescriptorType)


def signal_raised(exc: BaseException, installed: set[CodeType]) -> bool:
    """Whether `exc`, no Exception, raised in the main thread while it ran a work of the batch, may be a signal's
    rather than the work's own: a KeyboardInterrupt (Python's SIGINT handler raises it wherever the main thread
    is), or one raised in a frame of a Python signal handler, installed when the batch began (`installed`: a
    handler may put the default back before it exits) or now (a SIGTERM handler's sys.exit()). Any other (a work's
    own sys.exit(), GeneratorExit, a task's CancelledError) is its caller's, as in any thread."""
    if isinstance(exc, KeyboardInterrupt):
        return True
    handlers = installed | handler_codes()
    if OPAQUE in handlers:
        return True  # a handler whose frames cannot be told: any interrupt may be its
    trace = exc.__traceback__
    while trace is not None:
        if trace.tb_frame.f_code in handlers:
            return True
        trace = trace.tb_next
    return False


_SIGNALS = tuple(signal.valid_signals())  # a set built anew on each call costs more than the look-ups


def handler_codes() -> set[CodeType]:
    """The code of every Python signal handler installed now."""
    codes = set()
    for number in _SIGNALS:
        try:
            handler = signal.getsignal(number)
        except (OSError, ValueError):
            continue
        try:
            code = _code_of(handler)
        except Exception:  # a handler object whose attributes raise: one whose frames cannot be told
            code = OPAQUE
        if code is not None:
            codes.add(code if isinstance(code, CodeType) else OPAQUE)
    return codes


def _code_of(handler: object) -> CodeType | None:
    """The code a Python signal handler runs: through partials, bound methods, static and class methods, wrappers
    that name what they wrap (``functools.wraps``, ``lru_cache``) and an object's ``__call__``. None for SIG_DFL,
    SIG_IGN and Python's own SIGINT handler (whose KeyboardInterrupt is told apart anyway); `OPAQUE` for a handler
    whose code cannot be seen."""
    if handler is None or isinstance(handler, int) or handler is signal.default_int_handler:
        return None
    for _ in range(16):  # a chain of wrappers; one longer than this is no handler anyone writes
        if isinstance(handler, FunctionType):
            return handler.__code__
        wrapped = getattr(handler, "__wrapped__", None)
        if wrapped is not None:
            handler = wrapped
        elif isinstance(handler, functools.partial):
            handler = handler.func
        elif isinstance(handler, MethodType | staticmethod | classmethod):
            handler = handler.__func__
        else:
            call = inspect.getattr_static(type(handler), "__call__", None)
            if call is None or not callable(call) or isinstance(call, _MADE_IN_C):
                return OPAQUE
            handler = call
    return OPAQUE
