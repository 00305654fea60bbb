//! The two ways the guard runs, behind one face: chained after the primary in the runtime's
//! conflist (`Chained`), or wrapping it (`Delegated`, when the config names a `delegate`).
//! Chosen once per exec from the config (`of`); each verb is then the mode's.

use super::{Invocation, add, check, del, delegated, gc, status};
use crate::cni::delegate::Delegate;
use crate::cni::env::Attachment;
use crate::error::Result;

pub trait Mode {
    /// The CNI result to print.
    fn add(&self, inv: &Invocation, attachment: &Attachment) -> Result<String>;
    fn del(&self, inv: &Invocation, attachment: &Attachment) -> Result<()>;
    fn check(&self, inv: &Invocation, attachment: &Attachment) -> Result<()>;
    fn gc(&self, inv: &Invocation) -> Result<()>;
    fn status(&self, inv: &Invocation) -> Result<()>;
}

/// After the primary in the runtime's chain: the primary has run (ADD) or runs next (DEL).
pub struct Chained;

/// Around the primary, which the guard runs itself.
pub struct Delegated<'a>(pub &'a Delegate);

/// The mode the network's config asks for.
pub fn of(inv: &Invocation) -> Box<dyn Mode + '_> {
    match inv.conf.delegate.as_ref() {
        Some(delegate) => Box::new(Delegated(delegate)),
        None => Box::new(Chained),
    }
}

impl Mode for Chained {
    fn add(&self, inv: &Invocation, attachment: &Attachment) -> Result<String> {
        add::run(inv, attachment)
    }
    fn del(&self, inv: &Invocation, attachment: &Attachment) -> Result<()> {
        del::run(inv, attachment)
    }
    fn check(&self, inv: &Invocation, attachment: &Attachment) -> Result<()> {
        check::run(inv, attachment)
    }
    fn gc(&self, inv: &Invocation) -> Result<()> {
        gc::run(inv)
    }
    fn status(&self, inv: &Invocation) -> Result<()> {
        status::run(inv)
    }
}

impl Mode for Delegated<'_> {
    fn add(&self, inv: &Invocation, attachment: &Attachment) -> Result<String> {
        delegated::add(inv, self.0, attachment)
    }
    fn del(&self, inv: &Invocation, attachment: &Attachment) -> Result<()> {
        delegated::del(inv, self.0, attachment)
    }
    fn check(&self, inv: &Invocation, attachment: &Attachment) -> Result<()> {
        delegated::check(inv, self.0, attachment)
    }
    fn gc(&self, inv: &Invocation) -> Result<()> {
        delegated::gc(inv, self.0)
    }
    fn status(&self, inv: &Invocation) -> Result<()> {
        delegated::status(inv, self.0)
    }
}
