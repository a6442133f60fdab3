//! A std-only HTTP/1.0 service skeleton: flakebot's starting point for `craft --service`.
//!
//! Accepts on the socket flakebot hands in (fd 3, with LISTEN_FDS=1 and LISTEN_PID its own pid: systemd's socket
//! activation), else listens on $LISTEN_ADDRESS:$PORT (default 127.0.0.1:8080; an OCI image sets 0.0.0.0, the address
//! of its own network namespace a container engine publishes); GET /health answers 200 once it listens. Keep every piece of
//! state under $STATE_DIRECTORY (write a temporary file and rename it, so a kill never leaves half a value).
//! SIGTERM (or SIGINT): stops accepting and exits 0. Add the service's routes in `route`: each returns a
//! `Response` (status and body, plus any header: `Response::new(302, "").header("Location", "/there")`).

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

static STOP: AtomicBool = AtomicBool::new(false);
const SIGTERM: i32 = 15;
const SIGINT: i32 = 2;
const MAX_BODY: usize = 64 * 1024;

#[repr(C)]
struct PollFd {
    fd: i32,
    events: i16,
    revents: i16,
}

extern "C" {
    // libc's signal() and poll(): std links libc already, so no crate is needed for them.
    fn signal(signum: i32, handler: extern "C" fn(i32)) -> usize;
    fn poll(fds: *mut PollFd, nfds: u64, timeout: i32) -> i32;
}

/// The listening socket handed in as fd 3 (sd_listen_fds: LISTEN_FDS=1, LISTEN_PID our own pid), if one was.
fn handed_in() -> Option<TcpListener> {
    use std::os::unix::io::FromRawFd;
    let pid: u32 = std::env::var("LISTEN_PID").ok()?.parse().ok()?;
    let fds: u32 = std::env::var("LISTEN_FDS").ok()?.parse().ok()?;
    if pid != std::process::id() || fds != 1 {
        return None; // meant for another process (or several sockets: not this program's)
    }
    Some(unsafe { TcpListener::from_raw_fd(3) })
}

extern "C" fn on_stop(_signum: i32) {
    STOP.store(true, Ordering::SeqCst); // async-signal-safe: an atomic store only
}

/// One request: its method, path, headers (name, value) and body.
pub struct Request {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    /// The value of header `name` (any case), if the request carries it.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// One answer: its status, its headers (Content-Length and Connection are added when it is sent; Content-Type is
/// application/octet-stream unless set here) and its body.
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn new(status: u16, body: impl Into<Vec<u8>>) -> Response {
        Response { status, headers: Vec::new(), body: body.into() }
    }

    /// The same answer with one more header, e.g. `.header("Content-Type", "application/json")`.
    pub fn header(mut self, name: &str, value: &str) -> Response {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }
}

fn main() {
    if std::env::args().skip(1).any(|a| a == "--help" || a == "-h") {
        println!("{}: an HTTP service\n\nEnvironment:\n  LISTEN_FDS       1: accept on fd 3 (with LISTEN_PID its pid), as flakebot and systemd hand it in\n  PORT             port to listen on otherwise (default 8080)\n  LISTEN_ADDRESS   address to listen on otherwise (default 127.0.0.1)\n  STATE_DIRECTORY  where its state is kept", env!("CARGO_PKG_NAME"));
        return;
    }
    let port: u16 = std::env::var("PORT").ok().and_then(|p| p.parse().ok()).unwrap_or(8080);
    let state = PathBuf::from(std::env::var("STATE_DIRECTORY").unwrap_or_else(|_| ".".into()));
    unsafe {
        signal(SIGTERM, on_stop);
        signal(SIGINT, on_stop);
    }
    let listener = match handed_in() {
        Some(listener) => {
            eprintln!("accepting on fd 3 (handed in), state in {}", state.display());
            listener
        }
        None => {
            let address = listen_address();
            let listener = TcpListener::bind((address, port)).unwrap_or_else(|e| {
                eprintln!("cannot listen on {address}:{port}: {e}");
                std::process::exit(1);
            });
            eprintln!("listening on {address}:{port}, state in {}", state.display());
            listener
        }
    };
    listener.set_nonblocking(true).expect("nonblocking listener");
    while !STOP.load(Ordering::SeqCst) {
        // woken by a connection at once; every 100 ms to see SIGTERM's flag
        let mut ready = PollFd { fd: std::os::unix::io::AsRawFd::as_raw_fd(&listener), events: 1, revents: 0 };
        if unsafe { poll(&mut ready, 1, 100) } <= 0 {
            continue;
        }
        match listener.accept() {
            Ok((stream, _)) => {
                if let Err(e) = serve(stream, &state) {
                    eprintln!("request failed: {e}");
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => eprintln!("accept: {e}"),
        }
    }
    eprintln!("stopping (signal)");
}

/// $LISTEN_ADDRESS, or 127.0.0.1 when unset; one that is not an IP address ends the start (never a silent default).
fn listen_address() -> std::net::IpAddr {
    match std::env::var("LISTEN_ADDRESS") {
        Err(_) => std::net::Ipv4Addr::LOCALHOST.into(),
        Ok(text) => text.parse().unwrap_or_else(|_| {
            eprintln!("LISTEN_ADDRESS {text:?} is not an IP address");
            std::process::exit(1);
        }),
    }
}

/// The answer to one request.
fn route(request: &Request, _state: &Path) -> Response {
    match (request.method.as_str(), request.path.as_str()) {
        ("GET", "/health") => Response::new(200, "ok\n"),
        _ => Response::new(404, "not found\n"),
    }
}

fn serve(mut stream: TcpStream, state: &Path) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        let n = read_some(&mut stream, &mut chunk)?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > 16 * 1024 {
            return reply(&mut stream, Response::new(431, "request head too large\n"));
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let mut words = head.split_whitespace();
    let (method, path) = (words.next().unwrap_or("").to_string(), words.next().unwrap_or("").to_string());
    let headers: Vec<(String, String)> = head
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    if length > MAX_BODY {
        return reply(&mut stream, Response::new(413, "body too large\n"));
    }
    let mut body = buf[head_end..].to_vec();
    while body.len() < length {
        let n = read_some(&mut stream, &mut chunk)?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    body.truncate(length);
    let answer = route(&Request { method, path, headers, body }, state);
    reply(&mut stream, answer)
}

/// One read, tried again when a signal interrupted it (SIGTERM during a request: the read timeout makes the kernel
/// return EINTR instead of restarting it, and the request in flight must still be answered).
fn read_some(stream: &mut TcpStream, chunk: &mut [u8]) -> std::io::Result<usize> {
    loop {
        match stream.read(chunk) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

fn reply(stream: &mut TcpStream, answer: Response) -> std::io::Result<()> {
    let reason = match answer.status {
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        307 => "Temporary Redirect",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        413 => "Payload Too Large",
        _ => "Status",
    };
    let mut head = format!("HTTP/1.0 {} {reason}\r\nContent-Length: {}\r\n", answer.status, answer.body.len());
    if !answer.headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("content-type")) {
        head.push_str("Content-Type: application/octet-stream\r\n");
    }
    for (name, value) in &answer.headers {
        // a CR or LF would end the header early and let the rest be read as another; the length and the close
        // are this function's own
        let own = name.eq_ignore_ascii_case("content-length") || name.eq_ignore_ascii_case("connection");
        if !own && !name.contains(['\r', '\n', ':']) && !value.contains(['\r', '\n']) {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
    }
    head.push_str("Connection: close\r\n\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(&answer.body)?;
    stream.flush()
}
