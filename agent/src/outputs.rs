//! Task outputs leaving the robot: files a task wrote, uploaded to the
//! cluster's bucket through URLs the server presigns, part by part, so a
//! cut link or a restart loses at most the part on the way.
//!
//! - [`upload`]: one file's upload as decisions without I/O (what to ask
//!   the server, which part to send where, what to journal), driven by
//!   events and the time.

pub mod upload;
