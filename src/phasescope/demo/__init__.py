"""`phasescope demo`: real, small PyTorch workloads to watch (`workloads`) and the code that starts and stops
them (`children`)."""
