//! Variables: the handler trait ([`Variable`]) and the value a handler gives ([`VarSlot`]'s
//! setters), safe code on the primitives: registration at configuration time
//! ([`add_variable`], [`variable_index`], [`super::content::VarDef`]), the handler trampoline
//! and the raw store into nginx's value slot are in `content.rs` with the other request hooks.

use core::ptr::{self, NonNull};

use super::request::Req;
use super::Status;

pub use super::content::{add_variable, variable_index, VarSlot};

/// A variable's handler.
pub trait Variable {
    /// Fills `v` with the value for `r`; `data` is what the variable was registered with.
    fn get(r: Req, v: &mut VarSlot, data: usize) -> Status;
}

impl VarSlot {
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
