//! kmem-malloc: the C malloc family on kmem, for `LD_PRELOAD` (work in progress on this branch).
