//! Start-up settings of the services (`redrive-planner`, `redrive-executor`):
//! parsed by clap into typed values, and every bad setting reported at once.
//!
//! clap stops at the first value it cannot parse. An operator fixing a
//! deployment would then meet the problems one restart at a time, so when clap
//! refuses a value, [`refused_values`] checks every other value with its own
//! value parser too. Once every value parses, the service's own checks (ranges
//! that depend on each other, URLs) run and report every problem they find.

use std::{ffi::OsString, process::ExitCode};

use clap::{Command, Parser, error::ErrorKind};

/// Exit code for a bad setting (sysexits.h `EX_USAGE`).
pub const EX_USAGE: u8 = 64;

/// `error` and its causes, outermost first, joined by `: `, leaving out a
/// cause whose text an earlier one already holds (a database error's
/// message is its wrapper's too: said once).
pub fn error_text(error: &(dyn std::error::Error + 'static)) -> String {
    error_text_from(error.to_string(), error.source())
}

/// `first`, then each cause of the chain from `source` that does not repeat
/// one before it, joined by `: ` ([`error_text`] with a first part of the
/// caller's, e.g. a gRPC status's message).
pub fn error_text_from(
    first: String,
    mut source: Option<&(dyn std::error::Error + 'static)>,
) -> String {
    let mut parts = vec![first];
    while let Some(cause) = source {
        let text = cause.to_string();
        if !parts.iter().any(|part| part.contains(&text)) {
            parts.push(text);
        }
        source = cause.source();
    }
    parts.join(": ")
}

/// What a service's run that ended with `error` exits with: [`EX_USAGE`]
/// for a setting found wrong only when used (its message starts with
/// `invalid setting`, as [`SettingError`]'s do: an address that cannot be
/// bound), as at parsing; 1 otherwise.
pub fn run_failure_code(error: &dyn std::fmt::Display) -> ExitCode {
    if error.to_string().starts_with("invalid setting") {
        ExitCode::from(EX_USAGE)
    } else {
        ExitCode::FAILURE
    }
}

/// A setting that is wrong, named.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid setting --{setting}: {problem}")]
pub struct SettingError {
    /// The flag name, without dashes.
    pub setting: &'static str,
    /// What is wrong.
    pub problem: String,
}

impl SettingError {
    /// A problem with `--setting`.
    pub fn new(setting: &'static str, problem: impl Into<String>) -> Self {
        Self {
            setting,
            problem: problem.into(),
        }
    }
}

/// Every problem of a configuration, in flag order; never empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingErrors(pub Vec<SettingError>);

impl std::fmt::Display for SettingErrors {
    /// One line a problem.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (index, error) in self.0.iter().enumerate() {
            if index > 0 {
                writeln!(f)?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

impl std::error::Error for SettingErrors {}

impl SettingErrors {
    /// `Ok` when `problems` is empty.
    ///
    /// # Errors
    /// The problems.
    pub fn check(problems: Vec<SettingError>) -> Result<(), Self> {
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Self(problems))
        }
    }
}

/// Parses a service's settings from `args` (the first is the program name) and
/// the environment, then runs `prepare` (the checks clap cannot make, and
/// whatever completes the settings, such as reading secret files). Prints
/// help, the version or every problem (prefixed with `program: `) and
/// answers the exit code when the service should not start: 0 after
/// `--help`/`--version`, [`EX_USAGE`] for a bad setting.
///
/// # Errors
/// The exit code, after printing.
pub fn parse_or_exit<C: Parser>(
    program: &str,
    args: impl IntoIterator<Item = OsString>,
    prepare: impl FnOnce(C) -> Result<C, SettingErrors>,
) -> Result<C, ExitCode> {
    let args: Vec<OsString> = args.into_iter().collect();
    let command = C::command();
    let parsed = command
        .clone()
        .try_get_matches_from(&args)
        .and_then(|matches| C::from_arg_matches(&matches));
    match parsed {
        Ok(config) => match prepare(config) {
            Ok(config) => Ok(config),
            Err(problems) => {
                print_once(program, problems.0.iter().map(ToString::to_string));
                Err(ExitCode::from(EX_USAGE))
            }
        },
        Err(error) if !error.use_stderr() => {
            let _ = error.print();
            Err(ExitCode::SUCCESS)
        }
        Err(error) => {
            let mut refused = match error.kind() {
                ErrorKind::InvalidValue | ErrorKind::ValueValidation => {
                    refused_values(&command, &args)
                }
                _ => Vec::new(),
            };
            // A value the walk cannot see (a flag's boolean environment
            // variable) is still named: clap's own error leads.
            let first = with_origin(&command, &args, &error, first_line(&error));
            if !refused.is_empty() && !refused.contains(&first) {
                refused.insert(0, first);
            }
            if !refused.is_empty() {
                print_once(program, refused);
            } else {
                let _ = error.print();
            }
            Err(ExitCode::from(EX_USAGE))
        }
    }
}

/// Prints each of `problems` once, prefixed with `program: `, in order: one
/// line a problem, however many values repeat it.
fn print_once(program: &str, problems: impl IntoIterator<Item = String>) {
    let mut said: Vec<String> = Vec::new();
    for line in problems {
        if !said.contains(&line) {
            eprintln!("{program}: {line}");
            said.push(line);
        }
    }
}

/// The defaults of `C`, parsed as if `program` ran with no argument, reading
/// no environment variable (what the environment of a test run happens to
/// hold never changes a test's service): tests build settings this way.
///
/// # Panics
/// When a default does not parse.
pub fn defaults_without_env<C: Parser>(program: &str) -> C {
    let command = C::command().mut_args(|arg| arg.env(None));
    command
        .try_get_matches_from([program])
        .and_then(|matches| C::from_arg_matches(&matches))
        .expect("the defaults parse")
}

/// A service's settings: parsed by clap, with secrets that may be named by
/// file (`--…-file`) and checks that clap cannot make.
pub trait ServiceSettings: Parser + Clone {
    /// Reads every secret file into its setting ([`read_secret_into`]),
    /// a file that cannot be read or is empty into `problems`.
    fn read_secret_files(&mut self, problems: &mut Vec<SettingError>);

    /// The settings with every secret file read into its setting.
    ///
    /// # Errors
    /// A file that cannot be read or is empty (named, never its content).
    fn with_secret_files(mut self) -> Result<Self, SettingErrors> {
        let mut problems = Vec::new();
        self.read_secret_files(&mut problems);
        SettingErrors::check(problems)?;
        Ok(self)
    }

    /// Checks what clap cannot, every setting.
    ///
    /// # Errors
    /// [`SettingErrors`] naming every wrong setting.
    fn validate(&self) -> Result<(), SettingErrors>;

    /// How the service logs, serves its metrics and exports telemetry.
    fn telemetry(&self) -> &TelemetrySettings;
}

/// [`parse_or_exit`] for a service: the secret files are read (once) and
/// the settings checked with them.
///
/// # Errors
/// The exit code, after printing.
pub fn parse_service<C: ServiceSettings>(
    program: &str,
    args: impl IntoIterator<Item = OsString>,
) -> Result<C, ExitCode> {
    parse_or_exit::<C>(program, args, |mut config| {
        // Every problem at once: an unreadable secret file does not hide
        // the others (its setting keeps the value it had without the file).
        let mut problems = Vec::new();
        config.read_secret_files(&mut problems);
        if let Err(SettingErrors(more)) = config.validate() {
            problems.extend(more);
        }
        SettingErrors::check(problems)?;
        Ok(config)
    })
}

/// Every value (from a flag, an environment variable or a default) that its
/// argument's value parser refuses, as clap's one-line messages, in flag
/// order. Empty when the arguments do not even parse as text (an unknown
/// flag, a missing value): clap's own error says that.
pub fn refused_values(command: &Command, args: &[OsString]) -> Vec<String> {
    // First every value as text, so that none stops the others.
    // (A flag without a value reads its environment variable as a boolean:
    // it is checked on its own below.)
    let lenient = command.clone().mut_args(|arg| {
        if arg.get_action().takes_values() {
            arg.value_parser(clap::builder::OsStringValueParser::new())
        } else {
            arg.env(None)
        }
    });
    let Ok(matches) = lenient.try_get_matches_from(args) else {
        return Vec::new();
    };
    let mut refused = Vec::new();
    for arg in command.get_arguments() {
        if !arg.get_action().takes_values() && arg.get_env().is_some() {
            let alone = Command::new("setting")
                .no_binary_name(true)
                .disable_help_flag(true)
                .disable_version_flag(true)
                .arg(arg.clone());
            if let Err(error) = alone.try_get_matches_from(Vec::<OsString>::new()) {
                refused.push(with_origin(command, args, &error, first_line(&error)));
            }
            continue;
        }
        let (Some(long), true) = (arg.get_long(), arg.get_action().takes_values()) else {
            continue;
        };
        let Some(values) = matches.get_raw(arg.get_id().as_str()) else {
            continue;
        };
        // Then each value alone, through the argument as the service declares
        // it (its value parser, its name in the message).
        let alone = Command::new("setting")
            .no_binary_name(true)
            .disable_help_flag(true)
            .disable_version_flag(true)
            .arg(
                arg.clone()
                    .env(None)
                    .required(false)
                    .value_delimiter(None)
                    .default_value(None)
                    .num_args(1),
            );
        for value in values {
            let mut flag = OsString::from(format!("--{long}="));
            flag.push(value);
            if let Err(error) = alone.clone().try_get_matches_from([flag]) {
                refused.push(with_origin(command, args, &error, first_line(&error)));
            }
        }
    }
    refused
}

/// `line`, clap's message for a refused value of a flag, with what clap
/// says on later lines (the values it takes) and, when the value came from
/// the flag's environment variable (not given on the command line), that
/// variable's name: `invalid value 'yes' for '--four-eyes' (expected true
/// or false; from REDRIVE_FOUR_EYES)`.
fn with_origin(
    command: &clap::Command,
    args: &[OsString],
    error: &clap::Error,
    line: String,
) -> String {
    use clap::error::{ContextKind, ContextValue};
    let Some(ContextValue::String(flag)) = error.get(ContextKind::InvalidArg) else {
        return line;
    };
    let Some(long) = flag
        .strip_prefix("--")
        .and_then(|rest| rest.split([' ', '=']).next())
    else {
        return line;
    };
    let Some(arg) = command
        .get_arguments()
        .find(|arg| arg.get_long() == Some(long))
    else {
        return line;
    };
    let mut notes = Vec::new();
    if let Some(ContextValue::Strings(values)) = error.get(ContextKind::ValidValue) {
        notes.push(format!("expected {}", values.join(" or ")));
    }
    let on_command_line = args.iter().skip(1).any(|given| {
        let given = given.to_string_lossy();
        given == format!("--{long}") || given.starts_with(&format!("--{long}="))
    });
    if let Some(variable) = arg.get_env()
        && !on_command_line
        && std::env::var_os(variable).is_some()
    {
        notes.push(format!("from {}", variable.to_string_lossy()));
    }
    if notes.is_empty() {
        line
    } else {
        format!("{line} ({})", notes.join("; "))
    }
}

/// The first line of clap's message, without its `error: ` prefix.
fn first_line(error: &clap::Error) -> String {
    let text = error.to_string();
    let line = text.lines().next().unwrap_or_default();
    line.trim_start_matches("error: ").to_owned()
}

/// The telemetry settings every service takes, flattened into its
/// settings (`#[command(flatten)]`): how it logs, where it serves its metrics
/// and where it exports spans and metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
#[group(skip)]
pub struct TelemetrySettings {
    /// Log as JSON lines instead of text.
    #[arg(long, env = "REDRIVE_LOG_JSON", default_value_t = false)]
    pub log_json: bool,

    /// Serve Prometheus metrics at `http://ADDR/metrics` (plaintext, no
    /// authentication: bind it where only the scraper reaches). Off when
    /// not set.
    #[arg(long, env = "REDRIVE_METRICS_LISTEN", value_name = "ADDR")]
    pub metrics_listen: Option<std::net::SocketAddr>,

    /// OTLP/gRPC collector spans (in batches) and metrics (every 10 s) are
    /// pushed to; off when not set. The standard variable of the
    /// OpenTelemetry SDKs; `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`
    /// and `OTEL_TRACES_SAMPLER` apply too.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT", value_name = "URL")]
    pub otlp_endpoint: Option<String>,
}

impl TelemetrySettings {
    /// Checks what clap cannot.
    ///
    /// # Errors
    /// An `--otlp-endpoint` that is not an `http://HOST[:PORT]` URL. TLS to
    /// the collector is not built in: `https://` is refused here, where it
    /// would otherwise fail only at start; send to a collector or agent next
    /// to the service.
    pub fn check(&self) -> Result<(), SettingError> {
        let Some(endpoint) = &self.otlp_endpoint else {
            return Ok(());
        };
        let problem = |text: String| Err(SettingError::new("otlp-endpoint", text));
        if endpoint.starts_with("https://") {
            return problem(format!(
                "{endpoint:?}: TLS to the collector is not supported; use an http:// collector or agent next to the service"
            ));
        }
        let has_host = endpoint.starts_with("http://")
            && tonic::transport::Endpoint::from_shared(endpoint.clone())
                .is_ok_and(|parsed| parsed.uri().host().is_some_and(|host| !host.is_empty()));
        if has_host {
            Ok(())
        } else {
            problem(format!(
                "{endpoint:?} is not an http://HOST[:PORT] URL (e.g. http://127.0.0.1:4317)"
            ))
        }
    }
}

#[cfg(feature = "amqp")]
/// The broker setting every service takes, flattened into its settings: the
/// AMQP URL of each node of one RabbitMQ broker (a single node or the nodes
/// of one cluster, one virtual host), given directly or (since it carries a
/// password) by file.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
#[group(skip)]
pub struct AmqpSettings {
    /// AMQP URL of the RabbitMQ broker (`amqps://` for TLS). For a cluster,
    /// the URLs of several of its nodes, comma-separated, all of one virtual
    /// host: a connection goes to the first that answers, and after a lost
    /// or refused one to the next (round robin). With several URLs,
    /// --broker-id is required. A comma in a password needs no escaping: a
    /// URL starts only at a comma followed by `amqp://` or `amqps://`.
    #[arg(
        id = "amqp_url",
        long = "amqp-url",
        env = "REDRIVE_AMQP_URL",
        hide_env_values = true,
        value_name = "URL[,URL...]",
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f"
    )]
    pub url: String,

    /// A file holding the AMQP URL (or several node URLs, comma-separated,
    /// as for --amqp-url): read at start, surrounding whitespace dropped;
    /// overrides --amqp-url.
    #[arg(
        id = "amqp_url_file",
        long = "amqp-url-file",
        env = "REDRIVE_AMQP_URL_FILE",
        value_name = "FILE"
    )]
    pub url_file: Option<std::path::PathBuf>,
}

#[cfg(feature = "amqp")]
impl AmqpSettings {
    /// Reads `--amqp-url-file` into `url` ([`read_secret_into`]).
    pub fn read_secret_file(&mut self, problems: &mut Vec<SettingError>) {
        read_secret_into(
            "amqp-url-file",
            self.url_file.as_deref(),
            &mut self.url,
            problems,
        );
    }

    /// The node URLs of the setting, in the order given
    /// ([`split_amqp_urls`]); never empty for a value that
    /// [`AmqpSettings::check`] accepts.
    pub fn urls(&self) -> Vec<String> {
        split_amqp_urls(&self.url)
    }

    /// The node URLs as the connections use them: tried in order, round
    /// robin ([`crate::amqp_nodes::AmqpNodes`]).
    pub fn nodes(&self) -> crate::amqp_nodes::AmqpNodes {
        crate::amqp_nodes::AmqpNodes::new(self.urls())
    }

    /// Checks every node URL as lapin reads it ([`check_amqp_url`]), that
    /// they all name one virtual host, and that several come with
    /// `broker_id` (the service's `--broker-id`; see
    /// [`AmqpSettings::broker_id`] for why).
    ///
    /// # Errors
    /// Every problem found, the password hidden, named as `--amqp-url-file`
    /// when the URLs came from that file; with several URLs each problem
    /// says which one (`URL 2 of 3`).
    pub fn check(&self, broker_id: Option<&str>) -> Result<(), Vec<SettingError>> {
        // URLs read from a file are named by the file's setting.
        let setting = if self.url_file.is_some() {
            "amqp-url-file"
        } else {
            "amqp-url"
        };
        let urls = self.urls();
        let count = urls.len();
        let which = |index: usize| {
            if count > 1 {
                format!("URL {} of {count}: ", index + 1)
            } else {
                String::new()
            }
        };
        let mut problems = Vec::new();
        if urls.is_empty() {
            problems.push(SettingError::new(
                setting,
                "no URL given (e.g. amqp://guest:guest@127.0.0.1:5672/%2f)",
            ));
        }
        // The first good URL's virtual host, which every other must name.
        let mut first_vhost: Option<(usize, String)> = None;
        for (index, url) in urls.iter().enumerate() {
            let vhost = check_amqp_url(url).and_then(|()| {
                let uri = url
                    .parse::<lapin::uri::AMQPUri>()
                    .map_err(|error| redact_text(&error, url))?;
                if uri.authority.host.contains(',') {
                    return Err(format!(
                        "{:?}: a comma in the host; give each node a URL of its own \
                         (amqp://user:password@node-1/%2f,amqp://user:password@node-2/%2f)",
                        redact_url(url)
                    ));
                }
                Ok(uri.vhost)
            });
            match vhost {
                Err(text) => {
                    problems.push(SettingError::new(
                        setting,
                        format!("{}{text}", which(index)),
                    ));
                }
                Ok(vhost) => match &first_vhost {
                    None => first_vhost = Some((index, vhost)),
                    Some((first, expected)) if *expected != vhost => {
                        problems.push(SettingError::new(
                            setting,
                            format!(
                                "{}{:?} names virtual host {vhost:?} and URL {} names \
                                 {expected:?}: the URLs of one setting are nodes of one broker \
                                 and one virtual host (run a service per virtual host)",
                                which(index),
                                redact_url(url),
                                first + 1
                            ),
                        ));
                    }
                    Some(_) => {}
                },
            }
        }
        if let Some(plain) = urls.iter().position(|url| url.starts_with("amqp://"))
            && let Some(tls) = urls.iter().position(|url| url.starts_with("amqps://"))
        {
            problems.push(SettingError::new(
                setting,
                format!(
                    "URL {} uses amqp:// and URL {} amqps://: the nodes of one broker are \
                     reached one way, or a failover would send the password in clear text",
                    plain + 1,
                    tls + 1
                ),
            ));
        }
        if count > 1 && broker_id.is_none() {
            let vhost = first_vhost
                .map(|(_, vhost)| vhost.replace('%', "%25").replace('/', "%2f"))
                .unwrap_or_else(|| "%2f".to_owned());
            problems.push(SettingError::new(
                setting,
                format!(
                    "{count} node URLs need --broker-id (REDRIVE_BROKER_ID), one name of the \
                     cluster and virtual host that every service of it uses, e.g. --broker-id \
                     orders-cluster/{vhost}: a default would depend on which nodes are listed"
                ),
            ));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }

    /// The broker a service's database or Redis keys belong to: `explicit`
    /// (its `--broker-id`), else the URL's `host:port/vhost`
    /// ([`broker_id_of`]); the URL itself, password hidden, when it does not
    /// parse (refused by [`AmqpSettings::check`] anyway).
    ///
    /// With several node URLs `explicit` is required ([`AmqpSettings::check`]
    /// refuses the settings without it; here the first URL's id stands in).
    /// No default drawn from the URLs is the same for every service of one
    /// cluster: the node listed or reached first differs between services
    /// configured with other addresses, and an id made of the whole list
    /// (sorted) changes as soon as one service lists a node more or less (a
    /// rolling change of the list). Two ids for one broker would split its
    /// token bucket (the rate bound would hold per id, not for the broker)
    /// and its replay keys (docs/replay.md, "Identity"). The cluster name
    /// the broker announces (`cluster_name` of `connection.start`) is not
    /// used either: it is known only once connected, and can be renamed at
    /// run time (`rabbitmqctl set_cluster_name`).
    pub fn broker_id(&self, explicit: Option<&str>) -> String {
        match explicit {
            Some(id) => id.to_owned(),
            None => {
                let url = self.urls().first().cloned().unwrap_or_default();
                broker_id_of(&url).unwrap_or_else(|_| redact_url(&url))
            }
        }
    }
}

#[cfg(feature = "amqp")]
/// The node URLs of an `--amqp-url` value, in the order given:
/// [`split_urls`] at `amqp://` and `amqps://`.
pub fn split_amqp_urls(list: &str) -> Vec<String> {
    split_urls(list, &["amqp://", "amqps://"])
}

/// The URLs of a list of `schemes` URLs (`["amqp://", "amqps://"]`,
/// `["redis://", "rediss://"]`), in the order given: the value is cut at
/// each comma or whitespace followed (after more commas or whitespace) by
/// one of `schemes` (any case) or by the end, so that one URL a line in a
/// file, or a space between URLs, separates them too, while a comma
/// elsewhere (a password may hold one: RFC 3986 section 3.2.1 allows `,` in
/// user info) stays part of its URL. Each URL is trimmed and its scheme
/// lowercased (schemes are case-insensitive, RFC 3986 section 3.1); empty
/// ones (a trailing comma) are dropped.
pub fn split_urls(list: &str, schemes: &[&str]) -> Vec<String> {
    let separator = |c: char| c == ',' || c.is_whitespace();
    let scheme_length = |text: &str| {
        schemes.iter().find_map(|scheme| {
            text.get(..scheme.len())
                .filter(|start| start.eq_ignore_ascii_case(scheme))
                .map(|_| scheme.len())
        })
    };
    let starts_url = |rest: &str| {
        let rest = rest.trim_start_matches(separator);
        rest.is_empty() || scheme_length(rest).is_some()
    };
    let mut urls = Vec::new();
    let mut start = 0;
    for (at, c) in list.char_indices() {
        if separator(c) && starts_url(&list[at + c.len_utf8()..]) {
            urls.push(&list[start..at]);
            start = at + c.len_utf8();
        }
    }
    urls.push(&list[start..]);
    urls.into_iter()
        .map(|url| url.trim_matches(separator))
        .filter(|url| !url.is_empty())
        .map(|url| match scheme_length(url) {
            Some(length) => format!("{}{}", url[..length].to_ascii_lowercase(), &url[length..]),
            None => url.to_owned(),
        })
        .collect()
}

#[cfg(feature = "amqp")]
/// Checks an AMQP URI as lapin reads it (RabbitMQ's URI spec:
/// <https://www.rabbitmq.com/docs/uri-spec>), so that a bad port or query is
/// named at start-up instead of retried for ever.
///
/// # Errors
/// What is wrong with it.
pub fn check_amqp_url(url: &str) -> Result<(), String> {
    let shown = redact_url(url);
    if !url.starts_with("amqp://") && !url.starts_with("amqps://") {
        return Err(format!("{shown:?} is not an amqp:// URL"));
    }
    let after_scheme = url.split_once("://").map_or("", |(_, rest)| rest);
    if after_scheme.contains("//") {
        return Err(format!(
            "{shown:?}: a second \"//\" in one URL, as when two URLs run together; \
             separate node URLs with commas, each starting amqp:// or amqps://, \
             and write a \"/\" in a password or virtual host as %2F"
        ));
    }
    url.parse::<lapin::uri::AMQPUri>()
        .map(|_| ())
        .map_err(|error| format!("{shown:?}: {}", redact_text(&error.to_string(), url)))
}

#[cfg(feature = "amqp")]
/// The broker identity an AMQP URL names, without its credentials:
/// `host:port/vhost`, the host lowercased, the port RabbitMQ's default for the
/// scheme when the URL names none, the virtual host with `%` and `/`
/// percent-encoded (the default vhost `/` reads `%2f`, as in the URL):
/// `127.0.0.1:5672/%2f`. Replay keys and token buckets are qualified by it
/// (docs/replay.md, "Identity"), so two brokers or vhosts never share them.
///
/// # Errors
/// When `url` does not parse as lapin reads it ([`check_amqp_url`]).
pub fn broker_id_of(url: &str) -> Result<String, String> {
    check_amqp_url(url)?;
    let uri = url
        .parse::<lapin::uri::AMQPUri>()
        .map_err(|error| redact_text(&error.to_string(), url))?;
    let vhost = uri.vhost.replace('%', "%25").replace('/', "%2f");
    Ok(format!(
        "{}:{}/{vhost}",
        uri.authority.host.to_lowercase(),
        uri.authority.port
    ))
}

/// `url` with the password of its user info (`scheme://user:PASSWORD@host`,
/// RFC 3986 section 3.2.1) replaced by `***`, for logs and error messages;
/// unchanged when it has none. Read as text, not parsed, so that a URL that
/// does not parse (a `/` or `#` in the password, a mistyped scheme, two
/// URLs run together) is redacted too: the text is cut after each `//`,
/// and in each piece the user info ends at the piece's last `@` (a password
/// may hold `@`, as the `url` crate and the clients read it; a host never
/// does), its password being the text after its first `:`. An `@` later in
/// a path or query makes more hidden than needed, never less.
pub fn redact_url(url: &str) -> String {
    let mut shown = String::with_capacity(url.len());
    let mut copied = 0;
    for (from, to) in password_spans(url) {
        shown.push_str(&url[copied..from]);
        shown.push_str("***");
        copied = to;
    }
    shown.push_str(&url[copied..]);
    shown
}

/// The byte ranges of the passwords in `url` ([`redact_url`]'s reading).
fn password_spans(url: &str) -> Vec<(usize, usize)> {
    let starts: Vec<usize> = std::iter::once(0)
        .chain(url.match_indices("//").map(|(at, _)| at + 2))
        .collect();
    let mut spans = Vec::new();
    for (index, &start) in starts.iter().enumerate() {
        let end = starts
            .get(index + 1)
            .map_or(url.len(), |&next| next - 2)
            .max(start);
        let piece = &url[start..end];
        if let Some(at) = piece.rfind('@')
            && let Some(colon) = piece[..at].find(':')
            && colon + 1 < at
        {
            spans.push((start + colon + 1, start + at));
        }
    }
    spans
}

/// `text` with every occurrence of `url`'s passwords replaced by `***` (a
/// parser's error that quotes part of the URL).
pub fn redact_text(text: &str, url: &str) -> String {
    let mut shown = text.to_owned();
    for (from, to) in password_spans(url) {
        shown = shown.replace(&url[from..to], "***");
    }
    shown
}

/// Puts the secret of the `--…-file` setting `setting` into `setting_value`
/// when `path` names a file ([`read_secret_file`]); a file that cannot be
/// read goes to `problems` instead.
pub fn read_secret_into<T: From<String>>(
    setting: &'static str,
    path: Option<&std::path::Path>,
    setting_value: &mut T,
    problems: &mut Vec<SettingError>,
) {
    if let Some(path) = path {
        match read_secret_file(setting, path) {
            Ok(secret) => *setting_value = T::from(secret),
            Err(problem) => problems.push(problem),
        }
    }
}

/// The secret in `path` (a `--…-file` setting): the file's text without
/// surrounding whitespace (a trailing newline, as `echo` writes it).
///
/// # Errors
/// The file cannot be read, is not UTF-8 or is empty; the message names
/// `setting` and the path, never the content.
pub fn read_secret_file(
    setting: &'static str,
    path: &std::path::Path,
) -> Result<String, SettingError> {
    let text = std::fs::read_to_string(path).map_err(|error| {
        SettingError::new(setting, format!("cannot read {}: {error}", path.display()))
    })?;
    let secret = text.trim();
    if secret.is_empty() {
        return Err(SettingError::new(
            setting,
            format!("{} is empty", path.display()),
        ));
    }
    Ok(secret.to_owned())
}

#[cfg(test)]
mod tests {

    #[test]
    fn an_error_is_told_once_with_each_cause() {
        #[derive(Debug)]
        struct Inner;
        impl std::fmt::Display for Inner {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("role \"x\" does not exist")
            }
        }
        impl std::error::Error for Inner {}
        #[derive(Debug)]
        struct Outer(Inner);
        impl std::fmt::Display for Outer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "error returned from database: {}", self.0)
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let error = std::io::Error::other(Outer(Inner));
        assert_eq!(
            error_text(&Outer(Inner)),
            "error returned from database: role \"x\" does not exist"
        );
        // A cause it does not repeat is kept.
        assert!(
            error_text(&error).contains("does not exist"),
            "{}",
            error_text(&error)
        );
    }
    use super::*;
    use clap::CommandFactory;

    #[derive(Debug, Parser)]
    struct Settings {
        #[arg(long, default_value_t = 1)]
        count: u32,
        #[arg(long, value_delimiter = ',')]
        port: Vec<u16>,
        #[arg(long, default_value = "fine")]
        name: String,
    }

    #[test]
    fn url_passwords_are_redacted() {
        assert_eq!(
            redact_url("postgres://u:secret@db:5432/x?sslmode=require"),
            "postgres://u:***@db:5432/x?sslmode=require"
        );
        assert_eq!(redact_url("redis://redis:6379"), "redis://redis:6379");
        assert_eq!(redact_url("amqp://guest@h/%2f"), "amqp://guest@h/%2f");
        assert_eq!(redact_url("not a url"), "not a url");
        assert_eq!(
            redact_text("bad port in u:secret@h:x", "amqp://u:secret@h:x"),
            "bad port in u:***@h:x"
        );
    }

    fn args(list: &[&str]) -> Vec<OsString> {
        std::iter::once("test")
            .chain(list.iter().copied())
            .map(OsString::from)
            .collect()
    }

    #[test]
    fn every_refused_value_is_named() {
        let refused = refused_values(
            &Settings::command(),
            &args(&["--count=-3", "--port", "80,x,70000", "--name", "ok"]),
        );
        assert_eq!(refused.len(), 3, "{refused:#?}");
        assert!(refused[0].contains("'-3'") && refused[0].contains("--count"));
        assert!(refused[1].contains("'x'") && refused[1].contains("--port"));
        assert!(refused[2].contains("'70000'") && refused[2].contains("--port"));
    }

    #[test]
    fn good_values_and_unknown_flags_refuse_nothing_here() {
        let command = Settings::command();
        assert!(refused_values(&command, &args(&["--count", "3", "--port", "1,2"])).is_empty());
        // An unknown flag is clap's own error, reported as clap reports it.
        assert!(refused_values(&command, &args(&["--what", "3"])).is_empty());
    }

    #[test]
    fn validation_problems_are_all_kept() {
        let problems = SettingErrors::check(vec![
            SettingError::new("a", "first"),
            SettingError::new("b", "second"),
        ])
        .unwrap_err();
        assert_eq!(
            problems.to_string(),
            "invalid setting --a: first\ninvalid setting --b: second"
        );
        assert!(SettingErrors::check(Vec::new()).is_ok());
    }

    #[test]
    fn a_good_configuration_parses() {
        let parsed = parse_or_exit::<Settings>("test", args(&["--count", "2"]), Ok);
        assert_eq!(parsed.map(|s| s.count).ok(), Some(2));
        let refused = parse_or_exit::<Settings>("test", args(&["--count", "2"]), |_| {
            Err(SettingErrors(vec![SettingError::new("count", "too many")]))
        });
        assert_eq!(refused.err(), Some(ExitCode::from(EX_USAGE)));
    }
}

#[cfg(all(test, feature = "amqp"))]
mod amqp_tests {
    use super::*;

    fn settings(url: &str) -> AmqpSettings {
        AmqpSettings {
            url: url.to_owned(),
            url_file: None,
        }
    }

    fn problems(url: &str, broker_id: Option<&str>) -> Vec<String> {
        settings(url)
            .check(broker_id)
            .err()
            .unwrap_or_default()
            .into_iter()
            .map(|error| error.to_string())
            .collect()
    }

    #[test]
    fn several_node_urls_are_split_at_commas_that_start_a_url() {
        let list = "amqp://u:p@rabbit-1/%2f, amqps://u:p@rabbit-2:5671/%2f,";
        assert_eq!(
            split_amqp_urls(list),
            ["amqp://u:p@rabbit-1/%2f", "amqps://u:p@rabbit-2:5671/%2f"]
        );
        // A comma in a password stays in its URL.
        assert_eq!(
            split_amqp_urls("amqp://u:p,w@a/%2f,AMQP://u:x@b/%2f"),
            ["amqp://u:p,w@a/%2f", "amqp://u:x@b/%2f"]
        );
        // One URL a line (a file), spaces, doubled commas: separators too.
        for list in [
            "amqp://u:p@a/%2f\namqp://u:p@b/%2f\n",
            "amqp://u:p@a/%2f amqp://u:p@b/%2f",
            "amqp://u:p@a/%2f\r\n,,amqp://u:p@b/%2f",
            " amqp://u:p@a/%2f , , Amqp://u:p@b/%2f ",
        ] {
            assert_eq!(
                split_amqp_urls(list),
                ["amqp://u:p@a/%2f", "amqp://u:p@b/%2f"],
                "{list:?}"
            );
        }
        assert_eq!(split_amqp_urls("amqp://h/%2f"), ["amqp://h/%2f"]);
        assert!(split_amqp_urls(" , ").is_empty());
        let nodes = settings(list).nodes();
        assert_eq!(nodes.len(), 2);
        assert_eq!(nodes.next().address(), "rabbit-1:5672");
    }

    #[test]
    fn several_node_urls_of_one_vhost_with_a_broker_id_are_accepted() {
        let list = "amqp://u:p@rabbit-1:5672/orders,amqp://u:p@rabbit-2:5672/orders";
        assert_eq!(
            problems(list, Some("orders-cluster/orders")),
            Vec::<String>::new()
        );
        assert_eq!(
            settings(list).broker_id(Some("orders-cluster/orders")),
            "orders-cluster/orders"
        );
        // One URL needs no broker id, as before.
        assert!(problems("amqp://u:p@rabbit-1:5672/orders", None).is_empty());
        assert_eq!(
            settings("amqp://u:p@Rabbit-1:5672/orders").broker_id(None),
            "rabbit-1:5672/orders"
        );
    }

    #[test]
    fn urls_run_together_are_refused_without_their_passwords() {
        for list in [
            "amqp://guest:guest@127.0.0.1:5672/%2f,amqp//guest:S3cret@127.0.0.1/%2f",
            "amqp://guest:guest@127.0.0.1:5672/%2f,http://guest:S3cret@127.0.0.1/%2f",
            "amqp://guest:guest@127.0.0.1:5672/%2f, amqps ://guest:S3cret@127.0.0.1/%2f",
            "amqp//guest:S3cret@127.0.0.1/%2f",
        ] {
            let found = problems(list, Some("c/%2f"));
            assert_eq!(found.len(), 1, "{list:?}: {found:#?}");
            assert!(!found[0].contains("S3cret"), "{found:#?}");
            assert!(
                found[0].contains("run together") || found[0].contains("is not an amqp:// URL"),
                "{found:#?}"
            );
        }
        // Nor does the broker id a service would fall back to show one.
        let glued = settings("amqp//guest:S3cret@127.0.0.1/%2f");
        assert!(!glued.broker_id(None).contains("S3cret"));
    }

    #[test]
    fn a_password_that_stops_the_parser_is_still_hidden() {
        for url in [
            "amqp://guest:S3c/ret@127.0.0.1:5672/%2f",
            "amqp://guest:S3c?ret@127.0.0.1:5672/%2f",
            "amqp://guest:S3c#ret@127.0.0.1:5672/%2f",
            "amqp://guest:S3cret@h:notaport/%2f",
        ] {
            let found = problems(url, None);
            assert_eq!(found.len(), 1, "{url:?}: {found:#?}");
            assert!(!found[0].contains("S3c"), "{found:#?}");
            assert!(found[0].contains("guest:***@"), "{found:#?}");
        }
        assert_eq!(
            redact_url("amqp://u:p,w@a/%2f,amqp://v:x@b/%2f"),
            "amqp://u:***@a/%2f,amqp://v:***@b/%2f"
        );
        assert_eq!(redact_url("amqp://h/v@x"), "amqp://h/v@x");
        // A password holding `@`: the clients read the user info up to the
        // last `@`, so all of it is hidden (a review: `p@ss` showed `ss`).
        assert_eq!(
            redact_url("redis://:p@ss@host:6379/0"),
            "redis://:***@host:6379/0"
        );
        assert_eq!(
            redact_url("redis://u:a@b@s1:26379,redis://:c@d@s2:26379"),
            "redis://u:***@s1:26379,redis://:***@s2:26379"
        );
        assert_eq!(redact_url("u:p@w@h"), "u:***@h");
        assert_eq!(
            redact_text("refused u:p@w@h", "amqp://u:p@w@h"),
            "refused u:***@h"
        );
    }

    #[test]
    fn an_upper_case_scheme_is_read_and_mixed_schemes_are_refused() {
        assert!(problems("AMQP://guest:guest@127.0.0.1:5672/%2f", None).is_empty());
        let found = problems(
            "amqps://u:p@rabbit-1/%2f,amqp://u:p@rabbit-2/%2f",
            Some("c/%2f"),
        );
        assert_eq!(found.len(), 1, "{found:#?}");
        assert!(
            found[0].contains("URL 2 uses amqp:// and URL 1 amqps://"),
            "{found:#?}"
        );
    }

    #[test]
    fn a_bad_url_among_several_is_named_and_its_password_hidden() {
        let found = problems(
            // A URL starts at the text's start or at a comma followed by
            // `amqp://` or `amqps://`: the first one may be anything.
            "http://rabbit-0,amqp://u:p@rabbit-1/%2f,amqp://u:hunter2@rabbit-2:notaport/%2f",
            Some("orders-cluster/%2f"),
        );
        assert_eq!(found.len(), 2, "{found:#?}");
        assert!(
            found[0].starts_with("invalid setting --amqp-url: URL 1 of 3: ")
                && found[0].contains("is not an amqp:// URL"),
            "{found:#?}"
        );
        assert!(
            found[1].starts_with("invalid setting --amqp-url: URL 3 of 3: ")
                && found[1].contains("rabbit-2"),
            "{found:#?}"
        );
        assert!(!found.concat().contains("hunter2"), "{found:#?}");
        // From a file, the file's setting is named.
        let mut from_file = settings("amqp://u:p@a/%2f,amqp://u:p@b:x/%2f");
        from_file.url_file = Some("/run/secrets/amqp".into());
        let errors = from_file.check(Some("c/%2f")).unwrap_err();
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].setting, "amqp-url-file");
        // A host list inside one URL is not how nodes are given.
        let found = problems("amqp://u:hunter2@rabbit-1,rabbit-2/%2f", None);
        assert_eq!(found.len(), 1, "{found:#?}");
        assert!(found[0].contains("a URL of its own") && !found[0].contains("hunter2"));
    }

    #[test]
    fn urls_of_different_virtual_hosts_are_refused() {
        let found = problems(
            "amqp://u:p@rabbit-1/orders,amqp://u:secret@rabbit-2/billing",
            Some("orders-cluster/orders"),
        );
        assert_eq!(found.len(), 1, "{found:#?}");
        assert!(
            found[0].contains("URL 2 of 2")
                && found[0].contains("\"billing\"")
                && found[0].contains("\"orders\"")
                && !found[0].contains("secret"),
            "{found:#?}"
        );
    }

    #[test]
    fn several_urls_without_a_broker_id_are_refused_with_an_example() {
        let found = problems("amqp://u:p@rabbit-1/%2f,amqp://u:p@rabbit-2/%2f", None);
        assert_eq!(found.len(), 1, "{found:#?}");
        assert!(
            found[0].contains("2 node URLs need --broker-id")
                && found[0].contains("--broker-id orders-cluster/%2f"),
            "{found:#?}"
        );
        let found = problems("amqp://u:p@a/orders,amqp://u:p@b/orders", None);
        assert!(found[0].contains("orders-cluster/orders"), "{found:#?}");
        assert_eq!(problems(" ", None).len(), 1, "no URL at all");
    }
}
