//! Task outputs leaving the robot: files a task wrote, uploaded to the
//! cluster's bucket through URLs the server presigns, part by part, so a
//! cut link or a restart loses at most the part on the way.
//!
//! - [`take`]: finding a task's output files and putting them into the
//!   spool, through no symbolic link (blocking I/O);
//! - [`continuous`]: a running task's rolling files, each taken once it
//!   is closed and settled;
//! - [`spool`]: the files waiting, within the robot's quota and its
//!   policy when it is full;
//! - [`journal`]: what the spool holds and how far each upload got, on
//!   disk;
//! - [`upload`]: one file's upload as decisions without I/O (what to ask
//!   the server, which part to send where, what to journal), driven by
//!   events and the time;
//! - [`uploader`]: the shell that does what they decide.

pub mod continuous;
pub mod journal;
pub mod spool;
pub mod take;
pub mod upload;
pub mod uploader;

pub use spool::{OutputsConfig, Spool, WhenFull};
