//! Variables: the handler trait ([`Variable`]) and the value a handler gives ([`VarSlot`]'s
//! setters), safe code on the primitives: registration at configuration time
//! ([`add_variable`], [`variable_index`], [`super::request::VarDef`]), the handler trampoline
//! and the slot's raw access are in `request/mod.rs` with the other request hooks.

use core::ptr::{self, NonNull};

use super::request::Req;
use super::Status;

pub use super::request::{add_variable, variable_index, VarSlot};

/// A variable's handler.
pub trait Variable {
    /// Fills `v` with the value for `r`; `data` is what the variable was registered with.
    fn get(r: Req, v: &mut VarSlot, data: usize) -> Status;
}

impl VarSlot {
    /// Fills the slot: `len` bytes at `data`, found or not, never cached.
    #[inline]
    fn set(&mut self, data: *mut u8, len: usize, found: bool) {
        let v = self.value();
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
