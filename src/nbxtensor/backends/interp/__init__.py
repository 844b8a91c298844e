"""The interp device: host memory, Triton kernels run by Triton's interpreter."""
