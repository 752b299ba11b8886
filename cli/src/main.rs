use std::{io::Read, path::PathBuf, process::ExitCode};

/// glibc's malloc and free were a fifth of the serve process's samples under load (W1);
/// mimalloc's thread-local free lists cost a fraction of that. Its `override` feature also
/// serves the C code's malloc and free, which is where SQLite's store thread allocates.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::{Parser, Subcommand};
use hooklane::signing::{SecretError, SigningSecret};
use hooklane_cli::{
    config::{LogFormat, ServeConfig},
    receive, serve,
};

#[derive(Parser)]
#[command(
    name = "hooklane",
    version,
    about = "Reliable outbound webhooks: serve, receive, verify, relay"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Backend {
    Embedded,
    Aws,
}

#[derive(Subcommand)]
enum Command {
    /// Run the embedded shape: API, dispatcher and store in one process on a SQLite file
    /// (or, with --backend aws, the AWS shape's functions locally against the AWS APIs).
    Serve {
        /// A TOML file with the same settings as the HOOKLANE_* variables (which win).
        #[arg(long, env = "HOOKLANE_CONFIG")]
        config: Option<PathBuf>,
        /// `embedded` (SQLite, in-process queue) or `aws` (DynamoDB, SQS, Scheduler, SES at
        /// AWS_ENDPOINT_URL, configured by the Lambda functions' HOOKLANE_* variables).
        #[arg(long, value_enum, default_value_t = Backend::Embedded)]
        backend: Backend,
        /// With --backend aws: create (or reuse) the tables, queue and schedule group of a
        /// stack named PREFIX first, e.g. on moto_server or LocalStack.
        #[arg(long, value_name = "PREFIX")]
        provision: Option<String>,
    },
    /// Benchmark workloads against a Hooklane and the built-in endpoint farm on 127.0.0.1.
    Bench {
        /// A running Hooklane to target instead of starting one (its allow-list must include 127.0.0.1).
        #[arg(long)]
        url: Option<String>,
        /// Admin token of the Hooklane given with --url.
        #[arg(long, env = "HOOKLANE_ADMIN_TOKEN")]
        token: Option<String>,
        /// Workloads to run, comma-separated: w1 (throughput), w2 (isolation), w3 (flaky),
        /// w4 (steady latency), w5 (outage), w6 (steady latency while a purge runs).
        #[arg(long, default_value = "w1,w2,w3,w4,w5,w6")]
        workloads: String,
        /// Scaled-down sizes that finish in seconds.
        #[arg(long)]
        quick: bool,
        /// W1: endpoints each event goes to, so deliveries per publish call.
        #[arg(long, value_name = "N", default_value_t = 10, value_parser = clap::value_parser!(u16).range(1..=1000))]
        throughput_endpoints: u16,
        /// W1: publish N events a second, each when it is due whatever the calls before it are
        /// doing (an open loop, as a platform's traffic arrives), instead of from 32 publishers
        /// that each wait for their call; a call's time then counts from when it was due.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100_000))]
        publish_rate: Option<u32>,
        /// W5: accounts whose endpoints all answer 503 (default 9; 2 with --quick).
        #[arg(long, value_name = "N")]
        outage_accounts: Option<usize>,
        /// W5: endpoints per failing account (default 100; 10 with --quick).
        #[arg(long, value_name = "N")]
        outage_endpoints: Option<usize>,
        /// W5: events, spread over the failing accounts, each to all of its endpoints
        /// (default 9000; 40 with --quick).
        #[arg(long, value_name = "N")]
        outage_events: Option<usize>,
    },
    /// A local webhook receiver that prints (and, given the secret, verifies) what arrives.
    Receive {
        #[arg(long, default_value = "127.0.0.1:9000")]
        listen: std::net::SocketAddr,
        /// The endpoint's secret (whsec_...), to verify signatures; repeatable.
        #[arg(long, value_parser = secret_arg)]
        secret: Vec<SigningSecret>,
        /// Answer every webhook with this status (e.g. 500 to watch retries).
        #[arg(long, default_value_t = 200)]
        status: u16,
    },
    /// Publish the rows of your own outbox table (PostgreSQL or SQLite, written in your
    /// business transactions) to Hooklane, then mark them sent (docs/OUTBOX.md; needs a binary
    /// built with `--features relay`).
    Relay(RelayArgs),
    /// The AWS shape's dead-letter queue (needs a binary built with `--features aws`).
    Dlq {
        #[command(subcommand)]
        action: DlqAction,
    },
    /// Endpoint signing secrets at rest on AWS (needs a binary built with `--features aws`).
    Secrets {
        #[command(subcommand)]
        action: SecretsAction,
    },
    /// Verify a webhook you received: the raw body on stdin, the three headers as flags.
    Verify {
        /// The endpoint's secret (whsec_...); give it twice during a rotation.
        #[arg(long, required = true, value_parser = secret_arg)]
        secret: Vec<SigningSecret>,
        #[arg(long = "id")]
        webhook_id: String,
        #[arg(long = "timestamp")]
        webhook_timestamp: String,
        #[arg(long = "signature")]
        webhook_signature: String,
        /// Seconds a timestamp may differ from now.
        #[arg(long, default_value_t = hooklane::signing::DEFAULT_TOLERANCE_SECS)]
        tolerance: i64,
    },
}

#[derive(Subcommand)]
enum SecretsAction {
    /// After a key rotation (a new key, the old one as the previous): seal every endpoint
    /// secret of the stack's endpoints table that is still under the previous key under the
    /// new one. Reads HOOKLANE_TABLE_PREFIX (the stack name) and the keys from the SSM
    /// parameters HOOKLANE_SECRETS_KEY_PARAMETER and HOOKLANE_SECRETS_KEY_PREVIOUS_PARAMETER
    /// name (or HOOKLANE_SECRETS_KEY and HOOKLANE_SECRETS_KEY_PREVIOUS). The embedded shape
    /// does this at every start.
    Reseal,
}

#[derive(Subcommand)]
enum DlqAction {
    /// Move the dead letters back to the delivery queue, once their cause is fixed (the stack
    /// outputs DeadLetterQueueUrl and DeliveryQueueUrl name the two queues).
    Redrive {
        /// The dead-letter queue's URL.
        #[arg(long = "from", value_name = "URL")]
        dead_letters: String,
        /// The delivery queue's URL.
        #[arg(long = "to", value_name = "URL")]
        queue: String,
        /// Move at most this many messages.
        #[arg(long, default_value_t = usize::MAX, hide_default_value = true)]
        max: usize,
    },
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,hyper=warn,reqwest=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

fn runtime(mut builder: tokio::runtime::Builder) -> Result<tokio::runtime::Runtime, ExitCode> {
    builder.enable_all().build().map_err(|error| {
        eprintln!("hooklane: cannot start the runtime: {error}");
        ExitCode::FAILURE
    })
}

#[cfg(feature = "aws")]
fn serve_aws(provision: Option<&str>) -> ExitCode {
    init_logging(match std::env::var("HOOKLANE_LOG_FORMAT").as_deref() {
        Ok("json") => LogFormat::Json,
        _ => LogFormat::Text,
    });
    let runtime = match runtime(tokio::runtime::Builder::new_multi_thread()) {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    let vars = std::env::vars().collect();
    match runtime.block_on(hooklane_cli::serve_aws::run(vars, provision)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("hooklane: {error}");
            ExitCode::from(2)
        }
    }
}

#[cfg(feature = "aws")]
fn dlq(action: DlqAction) -> ExitCode {
    let DlqAction::Redrive {
        dead_letters,
        queue,
        max,
    } = action;
    let runtime = match runtime(tokio::runtime::Builder::new_current_thread()) {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    let moved = runtime.block_on(async {
        let sqs = hooklane::aws::aws_sdk_sqs::Client::new(&hooklane::aws::load_sdk_config().await);
        hooklane::aws::dlq::redrive(&sqs, &dead_letters, &queue, max).await
    });
    match moved {
        Ok(done) => {
            println!("moved {} message(s) back to the delivery queue", done.moved);
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("hooklane: dlq redrive: {error}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(feature = "aws")]
fn secrets(action: SecretsAction) -> ExitCode {
    use hooklane::store::dynamodb::{DynamoStore, Retention, TableNames};
    let SecretsAction::Reseal = action;
    let vars: std::collections::HashMap<String, String> = std::env::vars().collect();
    let Some(prefix) = vars
        .get("HOOKLANE_TABLE_PREFIX")
        .filter(|p| !p.trim().is_empty())
    else {
        eprintln!("hooklane: secrets reseal: set HOOKLANE_TABLE_PREFIX to the stack's name");
        return ExitCode::from(2);
    };
    let core = match hooklane::config::CoreConfig::default()
        .with_settings(|name| vars.get(name).map(String::as_str))
    {
        Ok(core) => core,
        Err(error) => {
            eprintln!("hooklane: configuration error: {error}");
            return ExitCode::from(2);
        }
    };
    let runtime = match runtime(tokio::runtime::Builder::new_current_thread()) {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    let parameter = |name: &str| vars.get(name).map(|v| v.trim()).filter(|v| !v.is_empty());
    let keys = runtime.block_on(async {
        let ssm = hooklane::aws::clients::ssm(&hooklane::aws::load_sdk_config().await, None);
        hooklane::aws::parameters::secrets_keys(
            &ssm,
            parameter("HOOKLANE_SECRETS_KEY_PARAMETER"),
            parameter("HOOKLANE_SECRETS_KEY_PREVIOUS_PARAMETER"),
            &core.secrets,
        )
        .await
    });
    let cipher = match keys.map(|keys| keys.cipher_or(None)) {
        Ok(Some(Ok(cipher))) => cipher,
        Ok(Some(Err(error))) => {
            eprintln!("hooklane: configuration error: {error}");
            return ExitCode::from(2);
        }
        Err(error) => {
            eprintln!("hooklane: secrets reseal: {error}");
            return ExitCode::from(2);
        }
        Ok(None) => {
            eprintln!(
                "hooklane: secrets reseal: set HOOKLANE_SECRETS_KEY_PARAMETER and \
                 HOOKLANE_SECRETS_KEY_PREVIOUS_PARAMETER (the SSM parameters of the new and \
                 the old key), or HOOKLANE_SECRETS_KEY and HOOKLANE_SECRETS_KEY_PREVIOUS"
            );
            return ExitCode::from(2);
        }
    };
    let key_id = cipher.key_id().to_owned();
    let report = runtime.block_on(async {
        // The functions' client: its writes that meet a transaction are tried again.
        let client =
            hooklane::aws::clients::dynamodb(&hooklane::aws::load_sdk_config().await, None);
        let store = DynamoStore::new(
            client,
            TableNames::with_prefix(prefix),
            Retention::default(),
            cipher,
        );
        let report = store.reseal_secrets().await?;
        // The account-token signing key is sealed with the same key: loading it re-seals it
        // (the api function's next start would too, but maybe only after the old key is gone).
        hooklane::service::tokens::signing_key(&store)
            .await
            .map_err(|e| hooklane::store::StoreError::Backend(e.to_string()))?;
        Ok::<_, hooklane::store::StoreError>(report)
    });
    match report {
        Ok(report) => {
            println!(
                "examined {} endpoint(s); re-sealed {} under key {key_id}; {} changed meanwhile; \
                 the account-token key is sealed under key {key_id}",
                report.examined, report.resealed, report.changed_meanwhile
            );
            if report.changed_meanwhile > 0 {
                println!("run it again to check the endpoints that changed meanwhile");
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("hooklane: secrets reseal: {error}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(not(feature = "aws"))]
fn secrets(_action: SecretsAction) -> ExitCode {
    eprintln!(
        "hooklane: this binary was built without the AWS backend; build it with \
         `cargo build --release -p hooklane-cli --features aws` (the embedded shape re-seals \
         its secrets at every start)"
    );
    ExitCode::from(2)
}

#[cfg(not(feature = "aws"))]
fn dlq(_action: DlqAction) -> ExitCode {
    eprintln!(
        "hooklane: this binary was built without the AWS backend; build it with          `cargo build --release -p hooklane-cli --features aws`"
    );
    ExitCode::from(2)
}

#[cfg(not(feature = "aws"))]
fn serve_aws(_provision: Option<&str>) -> ExitCode {
    eprintln!(
        "hooklane: this binary was built without the AWS backend; build it with \
         `cargo build --release -p hooklane-cli --features aws` (or run \
         `cargo run --release -p hooklane-cli --features aws -- serve --backend aws`)"
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let default = Command::Serve {
        config: None,
        backend: Backend::Embedded,
        provision: None,
    };
    match cli.command.unwrap_or(default) {
        Command::Serve {
            backend: Backend::Aws,
            config: Some(_),
            ..
        } => {
            eprintln!(
                "hooklane: --config (HOOKLANE_CONFIG) is for the embedded backend; \
                 --backend aws reads the Lambda functions' HOOKLANE_* variables"
            );
            ExitCode::from(2)
        }
        Command::Serve {
            backend: Backend::Aws,
            provision,
            ..
        } => serve_aws(provision.as_deref()),
        Command::Serve {
            provision: Some(_), ..
        } => {
            eprintln!("hooklane: --provision needs --backend aws");
            ExitCode::from(2)
        }
        Command::Serve { config, .. } => {
            let vars = std::env::vars().collect();
            let config = match ServeConfig::load(config.as_deref(), &vars) {
                Ok(config) => config,
                Err(error) => {
                    eprintln!("hooklane: configuration error: {error}");
                    return ExitCode::from(2);
                }
            };
            init_logging(config.log_format);
            let runtime = match runtime(tokio::runtime::Builder::new_multi_thread()) {
                Ok(runtime) => runtime,
                Err(code) => return code,
            };
            let background = match serve::background_runtime() {
                Ok(background) => background,
                Err(error) => {
                    eprintln!("hooklane: cannot start the runtime: {error}");
                    return ExitCode::FAILURE;
                }
            };
            match runtime.block_on(serve::run(config, background.handle().clone())) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!("hooklane: {error}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Bench {
            url,
            token,
            workloads,
            quick,
            throughput_endpoints,
            publish_rate,
            outage_accounts,
            outage_endpoints,
            outage_events,
        } => run_bench(
            url,
            token,
            workloads,
            quick,
            (usize::from(throughput_endpoints), publish_rate),
            [outage_accounts, outage_endpoints, outage_events],
        ),
        Command::Receive {
            listen,
            secret,
            status,
        } => {
            let runtime = match runtime(tokio::runtime::Builder::new_current_thread()) {
                Ok(runtime) => runtime,
                Err(code) => return code,
            };
            match runtime.block_on(receive::run(receive::ReceiveOptions {
                listen,
                secrets: secret,
                status,
            })) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!("hooklane: receive: {error}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Dlq { action } => dlq(action),
        Command::Secrets { action } => secrets(action),
        Command::Relay(args) => relay(args),
        Command::Verify {
            secret,
            webhook_id,
            webhook_timestamp,
            webhook_signature,
            tolerance,
        } => {
            let mut body = Vec::new();
            if let Err(error) = std::io::stdin().read_to_end(&mut body) {
                eprintln!("hooklane: cannot read the body from stdin: {error}");
                return ExitCode::from(2);
            }
            let now = chrono::Utc::now().timestamp();
            let secrets: Vec<&SigningSecret> = secret.iter().collect();
            match hooklane::signing::verify(
                &secrets,
                &webhook_id,
                &webhook_timestamp,
                &webhook_signature,
                &body,
                now,
                tolerance,
            ) {
                Ok(()) => {
                    println!("valid");
                    ExitCode::SUCCESS
                }
                Err(error) => {
                    println!("invalid: {error}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// A `--secret` flag, parsed once: a malformed secret is refused with the arguments.
fn secret_arg(raw: &str) -> Result<SigningSecret, SecretError> {
    SigningSecret::parse(raw.trim())
}

/// `hooklane relay`'s options as given.
#[cfg_attr(not(feature = "relay"), allow(dead_code))]
#[derive(clap::Args)]
struct RelayArgs {
    /// The database: postgres://user:password@host:port/db or sqlite:///path/to/file.db.
    #[arg(long, env = "HOOKLANE_RELAY_SOURCE", hide_env_values = true)]
    source: String,
    /// The Hooklane API, e.g. http://127.0.0.1:8080.
    #[arg(long, env = "HOOKLANE_RELAY_URL")]
    url: String,
    /// The admin token, or an API key with events:publish (limited to some accounts: their rows only).
    #[arg(long, env = "HOOKLANE_RELAY_TOKEN", hide_env_values = true)]
    token: String,
    /// The outbox table (schema.table allowed).
    #[arg(long, default_value = "hooklane_outbox")]
    table: String,
    /// The PostgreSQL channel the table's trigger notifies.
    #[arg(long, default_value = "hooklane_outbox")]
    channel: String,
    /// How often the table is read without a notification (SQLite: the poll interval).
    #[arg(long, default_value = "1s")]
    poll_interval: String,
    /// Rows read and published at a time.
    #[arg(long, default_value_t = 100)]
    batch: usize,
}

#[cfg(feature = "relay")]
fn relay(args: RelayArgs) -> ExitCode {
    init_logging(match std::env::var("HOOKLANE_LOG_FORMAT").as_deref() {
        Ok("json") => LogFormat::Json,
        _ => LogFormat::Text,
    });
    let poll_interval = match hooklane::config::parse_duration(&args.poll_interval, "poll-interval")
    {
        Ok(d) if !d.is_zero() => d,
        Ok(_) => {
            eprintln!("hooklane: relay: --poll-interval must be above zero");
            return ExitCode::from(2);
        }
        Err(error) => {
            eprintln!("hooklane: relay: --poll-interval {}", error.message);
            return ExitCode::from(2);
        }
    };
    let options = hooklane_cli::relay::RelayOptions {
        source: args.source,
        url: args.url,
        token: args.token,
        table: args.table,
        channel: args.channel,
        poll_interval,
        batch: args.batch,
    };
    let runtime = match runtime(tokio::runtime::Builder::new_current_thread()) {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    match runtime
        .block_on(async { hooklane_cli::relay::run(options, serve::shutdown_signal()).await })
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("hooklane: relay: {error}");
            ExitCode::from(2)
        }
    }
}

#[cfg(not(feature = "relay"))]
fn relay(_args: RelayArgs) -> ExitCode {
    eprintln!(
        "hooklane: relay: this binary was built without the relay; build it with \
         `cargo build --release -p hooklane-cli --features relay`"
    );
    ExitCode::from(2)
}

/// `hooklane bench`: built with the `bench` feature, which brings the test kit's farm.
#[cfg(feature = "bench")]
fn run_bench(
    url: Option<String>,
    token: Option<String>,
    workloads: String,
    quick: bool,
    (throughput_endpoints, publish_rate): (usize, Option<u32>),
    [accounts, endpoints, events]: [Option<usize>; 3],
) -> ExitCode {
    use hooklane_cli::bench;
    let default = if quick {
        bench::OutageSize::QUICK
    } else {
        bench::OutageSize::FULL
    };
    let outage = bench::OutageSize {
        accounts: accounts.unwrap_or(default.accounts).max(1),
        endpoints: endpoints.unwrap_or(default.endpoints).max(1),
        events: events.unwrap_or(default.events),
    };
    let workloads = match workloads
        .split(',')
        .map(bench::Workload::parse)
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(w) => w,
        Err(error) => {
            eprintln!("hooklane: bench: {error}");
            return ExitCode::from(2);
        }
    };
    let runtime = match runtime(tokio::runtime::Builder::new_multi_thread()) {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    match runtime.block_on(bench::run(bench::BenchOptions {
        url,
        token,
        workloads,
        quick,
        throughput_endpoints,
        publish_rate,
        outage,
    })) {
        Ok(_) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("hooklane: bench: {error}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(not(feature = "bench"))]
fn run_bench(
    _: Option<String>,
    _: Option<String>,
    _: String,
    _: bool,
    _: (usize, Option<u32>),
    _: [Option<usize>; 3],
) -> ExitCode {
    eprintln!(
        "hooklane: bench: this build has no benchmarks; build it with \
         `cargo build --release -p hooklane-cli --features bench`"
    );
    ExitCode::from(2)
}
