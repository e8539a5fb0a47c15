//! Which key components can be POSIX names.

/// Longest name a component may have, in bytes: `NAME_MAX` of Linux
/// (`include/uapi/linux/limits.h`). Longer components are not shown, never truncated.
pub const NAME_MAX: usize = 255;

/// Why a key component is not shown as a directory entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadName {
    /// Empty component (`a//b`, a leading `/`).
    Empty,
    /// `.` or `..`, which POSIX reserves.
    Dot,
    /// Longer than [`NAME_MAX`] bytes.
    TooLong,
    /// Holds a NUL byte, which no POSIX name can.
    Nul,
}

impl std::fmt::Display for BadName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BadName::Empty => "empty path component",
            BadName::Dot => "'.' or '..' path component",
            BadName::TooLong => "path component longer than 255 bytes",
            BadName::Nul => "NUL byte in path component",
        })
    }
}

/// Checks one path component of a key.
pub fn check_name(name: &str) -> Result<(), BadName> {
    match name {
        "" => Err(BadName::Empty),
        "." | ".." => Err(BadName::Dot),
        n if n.len() > NAME_MAX => Err(BadName::TooLong),
        n if n.contains('\0') => Err(BadName::Nul),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(check_name(""), Err(BadName::Empty));
        assert_eq!(check_name("."), Err(BadName::Dot));
        assert_eq!(check_name(".."), Err(BadName::Dot));
        assert_eq!(check_name("..."), Ok(()));
        assert_eq!(check_name(&"x".repeat(255)), Ok(()));
        assert_eq!(check_name(&"x".repeat(256)), Err(BadName::TooLong));
        // 128 two-byte characters are 256 bytes.
        assert_eq!(check_name(&"é".repeat(128)), Err(BadName::TooLong));
        assert_eq!(check_name("a b+c%d#(e)ü"), Ok(()));
    }
}
