//! Pseudo-terminals for interactive sessions (`k8s4r exec -t`): a pair
//! opened with a first size, and the size changed as the user's window
//! is. The slave becomes the command's stdin, stdout, stderr and
//! controlling terminal ([`crate::Launch::terminal`]).

use std::os::fd::{AsFd, OwnedFd};

/// A pty: the agent keeps `master`, the command gets `slave`.
#[derive(Debug)]
pub struct Pty {
    /// The agent's end.
    pub master: OwnedFd,
    /// The command's end.
    pub slave: OwnedFd,
}

/// Opens a pty of `cols` × `rows` (both closed on exec in the agent).
pub fn open(cols: u16, rows: u16) -> std::io::Result<Pty> {
    let size = nix::pty::Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let pair = nix::pty::openpty(Some(&size), None)?;
    for fd in [&pair.master, &pair.slave] {
        nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC))?;
    }
    Ok(Pty {
        master: pair.master,
        slave: pair.slave,
    })
}

/// Sets the size of the terminal whose master is `master`; its foreground
/// process group gets SIGWINCH.
pub fn resize(master: &impl AsFd, cols: u16, rows: u16) -> std::io::Result<()> {
    crate::sys::set_window_size(master.as_fd(), cols, rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pty_opens_with_its_size_and_resizes() {
        let pty = open(80, 24).unwrap();
        resize(&pty.master, 132, 43).unwrap();
        let size = nix::sys::termios::tcgetattr(&pty.slave).map(|_| ());
        assert!(size.is_ok(), "the slave is a terminal");
    }
}
