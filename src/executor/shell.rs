//! The one place that writes shell text and scheduler directives from data: POSIX quoting,
//! `#SBATCH` directive values, shell variable names, and the redaction of secrets for display.
//!
//! Every renderer (the Slurm batch script, the bare-metal remote command, the local job's
//! contract prologue, the dry run that shows them) goes through these functions, so a value is
//! quoted the same way wherever it ends up. Redaction is for what people read (dry runs, logs):
//! what is submitted is never redacted.

use std::borrow::Cow;

use super::ExecutorError;

/// The job prologue of executors that start the command from their own shell (local): run as
/// `sh -c CONTRACT_SCRIPT puzzletron-job SETUP VENV NPRE PRE... NPOST POST... ARGV...`, it
/// sources the setup script (when `SETUP` is not empty; a name without `/` is taken from the
/// working folder), runs the `NPRE` prerun commands, sources `VENV/bin/activate` (when `VENV`
/// is not empty), then runs the argv (by `exec` when there is no postrun command) and the
/// `NPOST` postrun commands, exiting with the argv's status. A failed setup step exits 126
/// with a line naming it. Every value is a positional argument, never script text; the prerun
/// and postrun commands are the site's own shell, as the runner file says.
pub(crate) const CONTRACT_SCRIPT: &str = r#"fail() { echo "puzzletron: $*" >&2; exit 126; }
setup=$1; venv=$2; shift 2
if [ -n "$setup" ]; then case $setup in */*) ;; *) setup=./$setup ;; esac; . "$setup" || fail "setup_env $setup failed"; fi
n=$1; shift; while [ "$n" -gt 0 ]; do eval "$1" || fail "prerun command failed: $1"; shift; n=$((n-1)); done
if [ -n "$venv" ]; then . "$venv/bin/activate" || fail "cannot activate the venv $venv"; fi
post=$1; shift; i=0; while [ "$i" -lt "$post" ]; do eval "p$i=\$1"; shift; i=$((i+1)); done
if [ "$post" -eq 0 ]; then exec "$@"; fi
"$@"; rc=$?
i=0; while [ "$i" -lt "$post" ]; do eval "eval "\$p$i""; i=$((i+1)); done
exit $rc
"#;

/// `argv` run under [`CONTRACT_SCRIPT`] with the contract's setup script, venv and commands;
/// `argv` itself when the contract asks for none of them.
pub(crate) fn with_contract(argv: Vec<String>, contract: &super::ExecutionContract) -> Vec<String> {
    let c = contract;
    if c.setup_env.is_none()
        && c.venv.is_none()
        && c.prerun_commands.is_empty()
        && c.postrun_commands.is_empty()
    {
        return argv;
    }
    let mut v = vec![
        "/bin/sh".to_string(),
        "-c".into(),
        CONTRACT_SCRIPT.into(),
        "puzzletron-job".into(),
        c.setup_env.clone().unwrap_or_default(),
        c.venv.clone().unwrap_or_default(),
        c.prerun_commands.len().to_string(),
    ];
    v.extend(c.prerun_commands.iter().cloned());
    v.push(c.postrun_commands.len().to_string());
    v.extend(c.postrun_commands.iter().cloned());
    v.extend(argv);
    v
}

/// Characters a word may consist of to be written without quotes: they mean nothing to a POSIX
/// shell (no expansion, globbing, word splitting or redirection).
const BARE: &[u8] = b"-_./=:,@%+";

/// Quotes `s` as one POSIX shell word: as is when every byte is a letter, digit or one of
/// `-_./=:,@%+` (and it is not empty), else `'...'` with each `'` written as `'\''`. Safe for
/// any string without NUL (which no shell argument can hold; specs refuse it earlier).
pub(crate) fn quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || BARE.contains(&b))
    {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    for c in s.chars() {
        if c == '\'' {
            out.push_str(r"'\''");
        } else {
            out.push(c);
        }
    }
    out.push('\'');
    out
}

/// Quotes every word of `argv` and joins them with spaces.
pub(crate) fn join(argv: &[String]) -> String {
    argv.iter().map(|a| quote(a)).collect::<Vec<_>>().join(" ")
}

/// Renders the value of an `#SBATCH` directive, double-quoted when it holds characters other
/// than letters, digits and `-_./=:,@%+[]`.
///
/// sbatch reads directives with its own parser, not a shell, and has no escape for `"`, `\`
/// or a line break (a newline would end the directive and start a shell command), so values
/// holding them, control characters or nothing at all are refused.
///
/// # Errors
/// [`ExecutorError::InvalidSpec`] naming `field`, the value and what is allowed.
#[cfg_attr(not(feature = "slurm"), allow(dead_code))] // the sbatch script's only
pub(crate) fn directive_value(field: &str, value: &str) -> Result<String, ExecutorError> {
    if value.is_empty() || value.contains(['"', '\\']) || value.chars().any(char::is_control) {
        return Err(ExecutorError::InvalidSpec {
            attempt_id: None,
            field: field.into(),
            value: value.into(),
            expected: "a non-empty value without '\"', '\\', line breaks or control characters \
                       (sbatch's directive parser has no escape for them)"
                .into(),
        });
    }
    if value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,@%+[]".contains(&b))
    {
        Ok(value.to_string())
    } else {
        Ok(format!("\"{value}\""))
    }
}

/// Whether `name` is a shell variable name, `[A-Za-z_][A-Za-z0-9_]*` (what `export NAME=`
/// accepts).
pub(crate) fn is_var_name(name: &str) -> bool {
    name.bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Whether an environment variable's value must not be shown in logs, dumps or dry runs: its
/// name contains `TOKEN`, `KEY`, `SECRET` or `PASSWORD` (any case).
pub(crate) fn is_secret_name(name: &str) -> bool {
    let up = name.to_ascii_uppercase();
    ["TOKEN", "KEY", "SECRET", "PASSWORD"]
        .iter()
        .any(|w| up.contains(w))
}

/// The text shown for a secret value.
pub(crate) const REDACTED: &str = "<redacted>";

/// `value`, or [`REDACTED`] when `name` is a secret's ([`is_secret_name`]).
pub(crate) fn redact_value<'a>(name: &str, value: &'a str) -> Cow<'a, str> {
    if is_secret_name(name) {
        Cow::Borrowed(REDACTED)
    } else {
        Cow::Borrowed(value)
    }
}

/// Redacts every assignment of a secret in a line of shell text for display: the value of each
/// word `NAME=value` (with or without `export `, quoted or not) whose `NAME` is a secret's
/// becomes `<redacted>`, up to the end of that word. Other text is kept as is.
pub(crate) fn redact_line(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(eq) = rest.find('=') {
        // The name is the run of name characters right before `=`, starting a word.
        let before = &rest[..eq];
        let start = before
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(0, |i| i + 1);
        let name = &before[start..];
        let word_start = start == 0
            || before[..start].ends_with(|c: char| c.is_whitespace() || c == ';' || c == '&');
        out.push_str(&rest[..=eq]);
        rest = &rest[eq + 1..];
        if is_var_name(name) && word_start && is_secret_name(name) {
            let end = word_end(rest);
            out.push_str(REDACTED);
            rest = &rest[end..];
        }
    }
    out.push_str(rest);
    out
}

/// The byte length of the shell word at the start of `s` (quotes respected).
fn word_end(s: &str) -> usize {
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        match (quote, c) {
            (None, '\\') | (Some('"'), '\\') => escaped = true,
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, c) if c.is_whitespace() || c == ';' || c == '&' || c == '|' => return i,
            _ => {}
        }
    }
    s.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_leaves_plain_words_and_neutralises_the_rest() {
        assert_eq!(quote("abc"), "abc");
        assert_eq!(quote("/a/b-c_d.e=f:g,h@i%j+k"), "/a/b-c_d.e=f:g,h@i%j+k");
        assert_eq!(quote(""), "''");
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote("$(rm -rf /)"), "'$(rm -rf /)'");
        assert_eq!(quote("*"), "'*'");
        assert_eq!(join(&["echo".into(), "a b".into()]), "echo 'a b'");
        // What a shell makes of the quoted words is the original text.
        for s in [
            "a b",
            "it's",
            "$HOME `x` \"q\" \\ *",
            "tab\there\nnewline",
            "",
        ] {
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(format!("printf %s {}", quote(s)))
                .output()
                .unwrap();
            assert_eq!(String::from_utf8_lossy(&out.stdout), s);
        }
    }

    #[test]
    fn the_contract_prologue_runs_setup_prerun_venv_command_postrun_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(
            d.join("setup.sh"),
            "echo setup >> order; export FROM_SETUP=1\n",
        )
        .unwrap();
        std::fs::create_dir_all(d.join("venv/bin")).unwrap();
        std::fs::write(d.join("venv/bin/activate"), "echo venv >> order\n").unwrap();
        let c = super::super::ExecutionContract {
            setup_env: Some("setup.sh".into()),
            venv: Some(d.join("venv").display().to_string()),
            prerun_commands: vec!["echo \"pre $FROM_SETUP\" >> order".into()],
            postrun_commands: vec!["echo post >> order".into()],
            ..Default::default()
        };
        let argv = with_contract(
            vec![
                "sh".into(),
                "-c".into(),
                "echo 'cmd it'\\''s' >> order; exit 3".into(),
            ],
            &c,
        );
        let st = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .current_dir(d)
            .status()
            .unwrap();
        assert_eq!(st.code(), Some(3), "the command's status");
        assert_eq!(
            std::fs::read_to_string(d.join("order")).unwrap(),
            "setup\npre 1\nvenv\ncmd it's\npost\n"
        );
        // A failing prerun stops before the command, exit 126.
        let bad = super::super::ExecutionContract {
            prerun_commands: vec!["false".into()],
            ..Default::default()
        };
        let argv = with_contract(vec!["touch".into(), "ran".into()], &bad);
        let out = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .current_dir(d)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(126));
        assert!(String::from_utf8_lossy(&out.stderr).contains("prerun command failed: false"));
        assert!(!d.join("ran").exists());
        assert_eq!(
            with_contract(vec!["x".into()], &Default::default()),
            vec!["x"]
        );
    }

    #[test]
    fn directive_values_are_checked() {
        assert_eq!(directive_value("f", "gpu").unwrap(), "gpu");
        assert_eq!(directive_value("f", "n[1-4]").unwrap(), "n[1-4]");
        assert_eq!(
            directive_value("f", "/a b/x.out").unwrap(),
            "\"/a b/x.out\""
        );
        for bad in ["", "a\"b", "a\\b", "a\nrm -rf ~", "a\rb", "a\tb"] {
            let e = directive_value("scheduler.account", bad).unwrap_err();
            assert!(e.to_string().contains("scheduler.account"), "{e}");
        }
    }

    #[test]
    fn secrets_are_redacted_for_display_only() {
        assert!(is_secret_name("HF_TOKEN") && is_secret_name("wandb_api_key"));
        assert!(!is_secret_name("HF_HOME"));
        assert_eq!(redact_value("HF_TOKEN", "abc"), REDACTED);
        assert_eq!(redact_value("HF_HOME", "/d"), "/d");
        assert_eq!(
            redact_line("export HF_TOKEN=abc"),
            "export HF_TOKEN=<redacted>"
        );
        assert_eq!(redact_line("export HF_HOME=/data"), "export HF_HOME=/data");
        assert_eq!(
            redact_line("  WANDB_API_KEY='a b' python x.py"),
            "  WANDB_API_KEY=<redacted> python x.py"
        );
        assert_eq!(
            redact_line("A=1 SECRET=\"x y\"; echo --key=3"),
            "A=1 SECRET=<redacted>; echo --key=3"
        );
        assert!(!is_var_name("1A") && !is_var_name("A-B") && is_var_name("_A1"));
    }
}
