//! The start of every command `redrivectl` suggests (`next:` hints, the
//! watch line's promote hint, "see `redrivectl plan report ID`"): the
//! `--profile` and `--planner` the user typed come along, so a hint copied
//! from a run against `--profile prod` goes to prod, not to the default
//! planner (values from `REDRIVE_PROFILE` and `REDRIVE_PLANNER` are left
//! out: the environment still has them).

tokio::task_local! {
    /// What suggested commands start with in this run ([`scope`]).
    static PREFIX: String;
}

/// Runs `work` with suggested commands starting with `prefix` (per task, so
/// runs side by side in one process, as in tests, keep their own).
pub async fn scope<F: std::future::Future>(prefix: String, work: F) -> F::Output {
    PREFIX.scope(prefix, work).await
}

/// `redrivectl` with the connection flags of this run ([`scope`]), or
/// plain `redrivectl` outside one.
pub fn redrivectl() -> String {
    PREFIX
        .try_with(Clone::clone)
        .unwrap_or_else(|_| "redrivectl".to_owned())
}

/// `redrivectl`, then `--profile NAME` and `--planner URL` when given
/// (flag or environment variable), each value quoted for a POSIX shell
/// where needed.
pub fn prefix(profile: Option<&str>, planner: Option<&str>) -> String {
    let mut text = "redrivectl".to_owned();
    for (flag, value) in [("--profile", profile), ("--planner", planner)] {
        if let Some(value) = value {
            text.push(' ');
            text.push_str(flag);
            text.push(' ');
            text.push_str(&shell_word(value));
        }
    }
    text
}

/// `value` as one POSIX shell word: as it is when it has only characters
/// no shell treats specially, else in single quotes.
pub fn shell_word(value: &str) -> String {
    let plain = !value.is_empty()
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:@,+=%".contains(c));
    if plain {
        value.to_owned()
    } else {
        format!("'{}'", value.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_keep_the_profile_and_planner_given() {
        assert_eq!(prefix(None, None), "redrivectl");
        assert_eq!(prefix(Some("prod"), None), "redrivectl --profile prod");
        assert_eq!(
            prefix(Some("prod"), Some("https://127.0.0.1:50051")),
            "redrivectl --profile prod --planner https://127.0.0.1:50051"
        );
        assert_eq!(
            prefix(Some("my team's"), None),
            r"redrivectl --profile 'my team'\''s'"
        );
    }
}
