//! Reading an `ncclConfig_t` the way NCCL does.
//!
//! Copy `min(config->size, sizeof(longest layout known))` bytes over an
//! all-undefined struct; reject a wrong magic; forget the fields that did not
//! exist in the caller's `config->version` (so stale bytes of an old, shorter
//! struct are never read as new fields); validate; map onto `oxccl::Config`.

use crate::abi::{ConfigV23005, NCCL_API_MAGIC, NCCL_CONFIG_UNDEF_INT};
use oxccl::{Config, Error, Result};
use std::ffi::{c_int, CStr};

/// What the C API needs from a config.
#[derive(Debug, Clone, Default)]
pub(crate) struct Parsed {
    /// `config->blocking` (None: undefined).
    pub blocking: Option<bool>,
    pub config: Config,
}

const U: c_int = NCCL_CONFIG_UNDEF_INT;

/// `NCCL_VERSION(2, minor, patch)` for the versions the field table uses.
const fn v(minor: u32, patch: u32) -> u32 {
    20000 + minor * 100 + patch
}

/// Reads `*config` (NULL: all defaults).
///
/// # Safety
/// `config` is NULL or points at `config->size` readable bytes (as NCCL requires).
pub(crate) unsafe fn parse(config: *const u8) -> Result<Parsed> {
    if config.is_null() {
        return Ok(Parsed::default());
    }
    let mut c = ConfigV23005::undefined();
    // SAFETY: the caller guarantees `size` is readable at the start of the struct.
    let size = unsafe { config.cast::<usize>().read_unaligned() };
    let n = whole_fields(size.min(std::mem::size_of::<ConfigV23005>()));
    // SAFETY: `n` bytes are readable (caller) and fit in `c`; every field of
    // ConfigV23005 is an integer or a raw pointer, valid for any bit pattern.
    unsafe { std::ptr::copy_nonoverlapping(config, (&mut c as *mut ConfigV23005).cast::<u8>(), n) };
    if n < 16 || c.magic != NCCL_API_MAGIC {
        return Err(Error::invalid_argument(format!(
            "ncclConfig_t argument not initialized via NCCL_CONFIG_INITIALIZER (size {size}, magic 0x{:x}, expected 0x{NCCL_API_MAGIC:x})",
            if n >= 12 { c.magic } else { 0 }
        )));
    }
    let ver = c.version;
    if ver < v(14, 0) {
        c.blocking = U;
    }
    if ver < v(17, 0) {
        c.cgaClusterSize = U;
        c.minCTAs = U;
        c.maxCTAs = U;
        c.netName = std::ptr::null();
    }
    if ver < v(18, 0) {
        c.splitShare = U;
    }
    if ver < v(25, 0) {
        c.trafficClass = U;
    }
    if ver < v(27, 0) {
        c.commName = std::ptr::null();
        c.collnetEnable = U;
        c.CTAPolicy = U;
        c.shrinkShare = U;
        c.nvlsCTAs = U;
    }
    if ver < v(28, 0) {
        c.nChannelsPerNetPeer = U;
        c.nvlinkCentricSched = U;
    }
    if ver < v(29, 0) {
        c.graphUsageMode = U;
        c.numRmaCtx = U;
    }
    if ver < v(30, 0) {
        c.maxP2pPeers = U;
    }
    if ver < v(30, 5) {
        c.graphStreamOrdering = U;
    }
    validate(&c)?;
    let mut out = Parsed {
        blocking: (c.blocking != U).then_some(c.blocking == 1),
        config: Config::default(),
    };
    if !c.commName.is_null() {
        // SAFETY: a non-NULL commName is a NUL-terminated string (NCCL's contract).
        let name = unsafe { CStr::from_ptr(c.commName) };
        out.config.name = Some(name.to_string_lossy().into_owned());
    }
    if c.minCTAs != U || c.maxCTAs != U {
        let mut h = Config::default().host_settings();
        if c.minCTAs != U {
            h.min_channels = Some(c.minCTAs as usize);
        }
        if c.maxCTAs != U {
            h.max_channels = Some(c.maxCTAs as usize);
        }
        out.config.host = Some(h);
    }
    Ok(out)
}

/// `n` bytes cut down to the fields they hold whole: a field that `size`
/// cuts in two is absent, not half read (a pointer with only some bytes from
/// the caller, e.g. size 52 into commName at 48..56, would be dereferenced).
fn whole_fields(n: usize) -> usize {
    use std::mem::offset_of;
    let ptr = std::mem::size_of::<*const u8>();
    for at in [
        offset_of!(ConfigV23005, netName),
        offset_of!(ConfigV23005, commName),
    ] {
        if n > at && n < at + ptr {
            return at;
        }
    }
    // The rest are 4-byte ints from offset 16 (before it: size, magic, version).
    if n >= 16 {
        n & !3
    } else {
        n
    }
}

fn validate(c: &ConfigV23005) -> Result<()> {
    let one_of = |name: &str, v: c_int, ok: &[c_int]| -> Result<()> {
        if v == U || ok.contains(&v) {
            Ok(())
        } else {
            Err(Error::invalid_argument(format!(
                "config.{name} = {v} is invalid (valid: {ok:?} or NCCL_CONFIG_UNDEF_INT)"
            )))
        }
    };
    let at_least = |name: &str, v: c_int, min: c_int| -> Result<()> {
        if v == U || v >= min {
            Ok(())
        } else {
            Err(Error::invalid_argument(format!(
                "config.{name} = {v} is invalid (must be >= {min} or NCCL_CONFIG_UNDEF_INT)"
            )))
        }
    };
    one_of("blocking", c.blocking, &[0, 1])?;
    at_least("cgaClusterSize", c.cgaClusterSize, 0)?;
    at_least("minCTAs", c.minCTAs, 1)?;
    at_least("maxCTAs", c.maxCTAs, 1)?;
    if c.minCTAs != U && c.maxCTAs != U && c.minCTAs > c.maxCTAs {
        return Err(Error::invalid_argument(format!(
            "config.minCTAs = {} is larger than config.maxCTAs = {}",
            c.minCTAs, c.maxCTAs
        )));
    }
    one_of("splitShare", c.splitShare, &[0, 1])?;
    one_of("collnetEnable", c.collnetEnable, &[0, 1])?;
    at_least("CTAPolicy", c.CTAPolicy, 0)?;
    one_of("shrinkShare", c.shrinkShare, &[0, 1])?;
    at_least("nvlsCTAs", c.nvlsCTAs, 1)?;
    at_least("nChannelsPerNetPeer", c.nChannelsPerNetPeer, 1)?;
    one_of("nvlinkCentricSched", c.nvlinkCentricSched, &[0, 1])?;
    one_of("graphUsageMode", c.graphUsageMode, &[0, 1, 2])?;
    at_least("numRmaCtx", c.numRmaCtx, 1)?;
    at_least("maxP2pPeers", c.maxP2pPeers, 1)?;
    one_of("graphStreamOrdering", c.graphStreamOrdering, &[0, 1])?;
    Ok(())
}

/// The blocking mode: `NCCL_COMM_BLOCKING` overrides the config; default
/// blocking (the parameter is read with the library's others).
pub(crate) fn blocking(cfg: Option<bool>) -> bool {
    oxccl::abi_support::blocking(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_size_that_cuts_a_field_leaves_it_undefined() {
        // A full config whose commName points nowhere readable: only the
        // bytes `size` covers may be read, so sizes ending inside commName
        // (49..55) or netName (33..39) must not dereference it.
        let mut c = ConfigV23005::undefined();
        c.magic = NCCL_API_MAGIC;
        c.version = v(30, 5);
        c.netName = 0x5a2a0 as *const _;
        c.commName = 0x5a2a0 as *const _;
        for size in (33..40).chain(49..56) {
            c.size = size;
            // SAFETY: `c` holds the whole layout; the pointer fields are
            // never read at these sizes (what the test checks).
            let p = unsafe { parse((&c as *const ConfigV23005).cast()) }.unwrap();
            assert_eq!(p.config.name, None, "size {size}");
        }
        assert_eq!(whole_fields(18), 16);
        assert_eq!(whole_fields(60), 60);
        assert_eq!(whole_fields(63), 60);
        assert_eq!(whole_fields(12), 12);
    }
}
