//! Variables: registration at configuration time ([`add_variable`], [`variable_index`]), the
//! handler trampoline ([`Variable`]) and the value slot a handler fills ([`VarSlot`]).

use core::ptr::{self, NonNull};

use ngx::ffi::{
    ngx_conf_t, ngx_http_add_variable, ngx_http_get_variable_index, ngx_http_request_t,
    ngx_http_variable_t, ngx_int_t, ngx_uint_t, ngx_variable_value_t,
};

use super::request::Req;
use super::{borrowed, Status};

/// A variable's handler.
pub trait Variable {
    /// Fills `v` with the value for `r`; `data` is what the variable was registered with.
    fn get(r: Req, v: &mut VarSlot, data: usize) -> Status;
}

extern "C" fn get_variable<V: Variable>(
    r: *mut ngx_http_request_t,
    v: *mut ngx_variable_value_t,
    data: usize,
) -> ngx_int_t {
    // SAFETY: nginx calls a variable handler with the live request and the value slot to fill.
    match unsafe { (Req::from_ptr(r), VarSlot::from_ptr(v)) } {
        (Some(r), Some(mut v)) => V::get(r, &mut v, data).0,
        _ => Status::NGX_ERROR.0,
    }
}

/// A variable registered with [`add_variable`] (it lives in the cycle).
pub struct VarDef(NonNull<ngx_http_variable_t>);

impl VarDef {
    /// Makes `V` the variable's handler, called with `data`.
    pub fn set_handler<V: Variable>(self, data: usize) {
        // SAFETY: the variable nginx returned lives in the cycle; configuration parsing is
        // single-threaded and nothing else refers to it during the call.
        let v = unsafe { &mut *self.0.as_ptr() };
        v.get_handler = Some(get_variable::<V>);
        v.data = data;
    }
}

/// Registers variable `name` (without `$`) with nginx's `NGX_HTTP_VAR_*` `flags`; `None` when
/// nginx refuses it (nginx logged why).
pub fn add_variable(cf: &mut ngx_conf_t, name: &[u8], flags: u32) -> Option<VarDef> {
    let mut s = borrowed(name);
    // SAFETY: cf is the configuration being parsed; nginx copies the name.
    let v = unsafe { ngx_http_add_variable(cf, &mut s, flags as ngx_uint_t) };
    NonNull::new(v).map(VarDef)
}

/// The index of variable `name` (without `$`), registering it as used (indexed).
pub fn variable_index(cf: &mut ngx_conf_t, name: &[u8]) -> Option<ngx_uint_t> {
    let mut s = borrowed(name);
    // SAFETY: cf is the configuration being parsed; nginx copies the name.
    let i = unsafe { ngx_http_get_variable_index(cf, &mut s) };
    ngx_uint_t::try_from(i).ok()
}

/// The value slot nginx passed to a variable handler.
pub struct VarSlot(NonNull<ngx_variable_value_t>);

impl VarSlot {
    /// # Safety
    /// `v` is null or the value slot nginx passed to the running variable handler.
    unsafe fn from_ptr(v: *mut ngx_variable_value_t) -> Option<VarSlot> {
        NonNull::new(v).map(VarSlot)
    }

    fn set(&mut self, data: *mut u8, len: usize, found: bool) {
        // SAFETY: see `from_ptr`; nginx reads the slot after the handler returns.
        let v = unsafe { self.0.as_mut() };
        // nginx's `len:28, valid:1, no_cacheable:1, not_found:1, escape:1` share one 32-bit unit.
        // One store of the whole unit: bindgen's setters go bit by bit, and the 28-bit `len`
        // alone cost about 450 instructions per value (callgrind.sh, `upstrand_value`).
        #[cfg(target_endian = "little")]
        {
            let bits: u32 = (len as u32 & 0x0fff_ffff)
                | (found as u32) << 28
                | 1 << 29
                | ((!found) as u32) << 30;
            v._bitfield_1 = ngx::ffi::__BindgenBitfieldUnit::new(bits.to_le_bytes());
            debug_assert!(v.len() as usize == len && v.no_cacheable() == 1 && v.escape() == 0);
        }
        #[cfg(not(target_endian = "little"))]
        {
            v.set_len(len as u32);
            v.set_valid(found as u32);
            v.set_no_cacheable(1);
            v.set_not_found((!found) as u32);
            v.set_escape(0);
        }
        v.data = data;
    }

    /// The variable is not found.
    pub fn not_found(&mut self) {
        self.set(ptr::null_mut(), 0, false);
    }

    /// The value is `value`, which lives as long as the configuration (nginx only reads it).
    pub fn set_static(&mut self, value: &'static [u8]) {
        let data = if value.is_empty() {
            NonNull::<u8>::dangling().as_ptr()
        } else {
            value.as_ptr().cast_mut()
        };
        self.set(data, value.len(), true);
    }

    /// The value is a copy of `value` in `r`'s pool; false when out of memory.
    pub fn set_copy(&mut self, r: Req, value: &[u8]) -> bool {
        let Some(copy) = r.copy(value) else {
            return false;
        };
        self.set(copy.data, copy.len, true);
        true
    }
}
