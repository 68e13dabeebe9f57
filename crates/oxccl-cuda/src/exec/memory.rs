//! Device memory as the C API sees it: where a pointer lives and how far
//! its allocation reaches, `ncclMemAlloc`'s allocations, the calling
//! thread's current device, and the IPC export and import of allocations
//! (windows).

use super::*;

/// The device (ordinal) of the calling thread's current context; `None`
/// without a driver or without a current context (a thread that never used
/// CUDA).
pub fn current_device() -> Option<i32> {
    loader::driver().ok()?;
    guarded("cuCtxGetCurrent", || {
        if cu::ctx_get_current()?.is_null() {
            return Ok(None);
        }
        // A context is current.
        Ok(Some(cu::ctx_get_device()?))
    })
    .ok()
    .flatten()
}

/// Where a pointer's memory is, as the collectives need to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Memory {
    /// Host memory (pageable, pinned, or unknown to CUDA), or no driver.
    Host,
    /// Device memory of this device ordinal.
    Device(i32),
}

/// A device allocation's extent as the driver reports it: (base, size).
pub type Extent = Option<(u64, u64)>;

/// Where `ptr` is, and the extent of its allocation, in one driver call
/// (`cuPointerGetAttributes`: memory type, device ordinal, range start and
/// size; a collective asks this for two buffers on every call, and one call
/// per pointer instead of three saves ~4 driver calls per collective). A
/// pointer CUDA does not know (zeroed attributes, or
/// `CUDA_ERROR_INVALID_VALUE`), host/pinned memory, NULL, or no driver at
/// all is [`Memory::Host`].
pub fn locate(ptr: *const c_void) -> Result<(Memory, Extent)> {
    if ptr.is_null() || loader::driver().is_err() {
        return Ok((Memory::Host, None));
    }
    guarded("cuPointerGetAttributes", || {
        use cu::CUpointer_attribute as A;
        let (mut kind, mut ord, mut base, mut size) = (0u32, -1i32, 0u64, 0usize);
        let mut attrs = [
            A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            A::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
            A::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
        ];
        let mut data: [*mut c_void; 4] = [
            &mut kind as *mut u32 as *mut c_void,
            &mut ord as *mut i32 as *mut c_void,
            &mut base as *mut u64 as *mut c_void,
            &mut size as *mut usize as *mut c_void,
        ];
        // SAFETY: four attributes, each written into a value of its size
        // (a 32-bit enum, an int, a CUdeviceptr, a size_t).
        let r = unsafe { cu::pointer_attributes(&mut attrs, &mut data, ptr as cu::CUdeviceptr) };
        if r.is_err_and(|e| e.code == CUresult::CUDA_ERROR_INVALID_VALUE) {
            return Ok((Memory::Host, None));
        }
        r?;
        if kind != cu::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 {
            return Ok((Memory::Host, None));
        }
        let extent = (size > 0).then_some((base, size as u64));
        Ok((Memory::Device(ord), extent))
    })
}

/// [`locate`]'s memory kind alone.
pub fn memory_of(ptr: *const c_void) -> Result<Memory> {
    locate(ptr).map(|x| x.0)
}

/// Checks that `bytes` from the device pointer `ptr` lie inside the
/// allocation `extent` that [`locate`] reported for it in the same call, so
/// an overrunning count is an error naming the argument (`what`, e.g.
/// "recvbuff") instead of a fault in a kernel. Memory the driver cannot
/// place (no extent) passes: nothing to check against.
pub fn check_extent_in(ptr: u64, bytes: usize, extent: Extent, what: &str) -> Result<()> {
    let Some((base, size)) = extent else {
        return Ok(());
    };
    if bytes == 0 || ptr == 0 {
        return Ok(());
    }
    let end = ptr as u128 + bytes as u128;
    if end > base as u128 + size as u128 {
        return Err(Error::invalid_argument(format!(
            "{what}: {bytes} bytes from {ptr:#x} run {} bytes past the end of its device \
             allocation ({size} bytes at {base:#x}): count too large for the buffer",
            end - (base as u128 + size as u128)
        )));
    }
    Ok(())
}

/// `ncclMemAlloc`'s device allocations: address -> the context that owns it.
pub(super) fn device_allocations() -> MutexGuard<'static, HashMap<u64, usize>> {
    static A: OnceLock<Mutex<HashMap<u64, usize>>> = OnceLock::new();
    lock(A.get_or_init(|| Mutex::new(HashMap::new())))
}

/// `cuMemAlloc` of `bytes` in the calling thread's current context; `None`
/// without a driver or a current context (the caller then uses host memory).
pub fn mem_alloc_current(bytes: usize) -> Result<Option<u64>> {
    if current_device().is_none() {
        return Ok(None);
    }
    guarded("cuMemAlloc", || {
        // A context is current.
        let ctx = cu::ctx_get_current()?;
        let p = cu::mem_alloc(bytes.max(1))?;
        device_allocations().insert(p, ctx as usize);
        Ok(Some(p))
    })
}

/// Frees a pointer of [`mem_alloc_current`]; `false` if it is not one.
pub fn mem_free(ptr: u64) -> Result<bool> {
    let Some(ctx) = device_allocations().remove(&ptr) else {
        return Ok(false);
    };
    let _scope = CtxScope::enter(ctx as cu::CUcontext)?;
    guarded("cuMemFree", || {
        // SAFETY: allocated by cuMemAlloc in this context, freed once (removed above).
        unsafe { cu::mem_free(ptr) }?;
        Ok(true)
    })
}

/// What `cudaSetDevice(ordinal)` does for the driver API: retains the
/// device's primary context and makes it current on the calling thread (for
/// tests and tools that drive the C API without the CUDA runtime). The
/// reference is kept for the life of the process.
pub fn use_device(ordinal: i32) -> Result<()> {
    loader::driver()?;
    guarded("cuDevicePrimaryCtxRetain", || {
        // The driver was probed.
        let dev = cu::device_get(ordinal)?;
        let ctx = cu::primary_ctx_retain(dev)?;
        // SAFETY: the context was just retained (for the life of the process).
        Ok(unsafe { cu::ctx_set_current(ctx) }?)
    })
}

/// Copies host bytes to device memory (ordered after the legacy default
/// stream's work), landed when it returns: from pageable memory
/// cuMemcpyHtoD returns once the bytes are staged, before the DMA lands, and
/// kernels on non-blocking streams are not ordered after it (CUDA's "API
/// synchronization behavior"), hence the context's synchronize.
pub fn copy_to_device(dst: u64, src: &[u8]) -> Result<()> {
    loader::driver()?;
    guarded("cuMemcpyHtoD", || {
        // SAFETY: the caller passes device memory of at least src.len() bytes.
        unsafe { cu::memcpy_htod(dst, src.as_ptr() as *const c_void, src.len()) }?;
        Ok(cu::ctx_synchronize()?)
    })
}

/// Copies device memory to host bytes (synchronous, as [`copy_to_device`]).
pub fn copy_from_device(dst: &mut [u8], src: u64) -> Result<()> {
    loader::driver()?;
    guarded("cuMemcpyDtoH", || {
        // SAFETY: the caller passes device memory of at least dst.len() bytes.
        Ok(unsafe { cu::memcpy_dtoh(dst.as_mut_ptr() as *mut c_void, src, dst.len()) }?)
    })
}

/// Waits for all work of the calling thread's current context.
/// The IPC handle of the device allocation starting at `base`, for
/// another process of this host to map it (`ncclCommWindowRegister`);
/// `None` when the allocation cannot be exported (VMM, other allocators).
pub fn export_allocation(base: u64) -> Option<[u8; 64]> {
    two_process_io::ipc_handle(base)
}

/// Maps (or takes another reference to) another process's allocation of
/// `handle` into GPU `ordinal`'s context, which must be current; its
/// address here. Released with [`release_allocation`].
pub fn import_allocation(ordinal: i32, handle: &[u8; 64]) -> Result<u64> {
    two_process_io::import(ordinal, handle)
}

/// Drops a reference from [`import_allocation`]; the last one unmaps it.
/// No queued work may use it (synchronise the context first).
pub fn release_allocation(ordinal: i32, mapped: u64) {
    two_process_io::release(ordinal, mapped)
}

pub fn synchronize_current() -> Result<()> {
    loader::driver()?;
    guarded("cuCtxSynchronize", || Ok(cu::ctx_synchronize()?))
}
