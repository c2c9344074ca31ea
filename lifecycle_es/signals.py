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
from types import CodeType, FunctionType, MethodType


def signal_raised(exc: BaseException, installed: set[CodeType]) -> bool:
    """Whether `exc`, no Exception, raised in the main thread while it ran a work of the batch, may be a signal's
    rather than the work's own: a KeyboardInterrupt (Python's SIGINT handler raises it wherever the main thread
    is), or one raised in a frame of a Python signal handler, installed when the batch began (`installed`: a
    handler may put the default back before it exits) or now (a SIGTERM handler's sys.exit()). Any other (a work's
    own sys.exit(), GeneratorExit, a task's CancelledError) is its caller's, as in any thread."""
    if isinstance(exc, KeyboardInterrupt):
        return True
    handlers = installed | handler_codes()
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
            code = _code_of(signal.getsignal(number))
        except (OSError, ValueError):
            continue
        if code is not None:
            codes.add(code)
    return codes


def _code_of(handler: object) -> CodeType | None:
    """The code a Python signal handler runs (a function, a bound method, a partial of either, an object's
    ``__call__``); None for SIG_DFL, SIG_IGN and C handlers."""
    if handler is None or isinstance(handler, int):  # SIG_DFL, SIG_IGN, or none set from Python
        return None
    while isinstance(handler, functools.partial | MethodType):
        handler = handler.func if isinstance(handler, functools.partial) else handler.__func__
    if isinstance(handler, FunctionType):
        return handler.__code__
    call = inspect.getattr_static(type(handler), "__call__", None)
    return call.__code__ if isinstance(call, FunctionType) else None
