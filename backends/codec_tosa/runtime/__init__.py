"""The runtime side: the one reader of `.pte` files (`pte`), ExecuTorch's runtime
(`executorch_runner`) and our C++ runtime backend (`native`, `cpp/`).

`BACKEND_ID` is the name under which the C++ backend registers
(cpp/codec_tosa_backend.cpp) and the class name of the ahead-of-time
`CodecTosaBackend`: ExecuTorch finds a backend by it, and the `.pte` names our
delegates by it."""

BACKEND_ID = "CodecTosaBackend"
