// gct-delayline: a userspace delay line on TAP devices, for kernels without netem.
//
// Every cable of a network is a pair of TAP devices (one in each namespace it joins), and each
// direction of a cable is a timestamped FIFO: a frame read from one TAP is written to the other
// once its delay (plus optional jitter, never reordering) has passed, unless the loss draw drops
// it. Frames keep flowing through the kernel's own TCP at both ends, so senders see the real RTT
// (this is not a proxy). With offloads on, the kernel hands over whole GSO frames (up to 64 KB)
// with a virtio-net header, which is what lets one core move ~1 Gbit/s; a cable with loss has
// offloads off so that loss applies per MTU-sized packet, as on a wire.
//
// One process serves every cable: writing a frame into a switch-side TAP makes the kernel bridge
// it to the next cable's TAP at once, and the same (awake) thread picks it up on its next
// zero-timeout poll, instead of a second process paying an idle CPU's wake-up on every hop.
//
// Every direction draws its loss and jitter from a generator of its own, seeded from SEED and the
// direction's place in the argument list, so what one direction draws does not depend on how its
// frames interleave with another's; 'seed' restarts every generator, so that each cell of a sweep
// that keeps its network draws the sequence a network of its own would (it does not depend on the
// cells before it). Each direction keeps the first kFirstDraws delays it drew since (re)seeding
// (before the no-reordering clamp; -1 for a frame lost), among its counters.
//
// usage: gct-delayline SEED CABLE...   where each CABLE is 11 arguments:
//   NETNS_A TAP_A NETNS_B TAP_B AB_DELAY_US AB_JITTER_US AB_LOSS_PPM BA_DELAY_US BA_JITTER_US
//   BA_LOSS_PPM OFFLOAD(0|1)
// NETNS_* are paths (/run/netns/NAME). Prints "ready" once every TAP is attached, and one JSON
// line of counters per direction on SIGTERM/SIGINT. Commands on stdin, one per line (CABLE counts
// from 0 in argument order), each answered by one line ("ok", "error: ..." or the counters):
//   loss CABLE ab|ba PPM                   that direction's loss from then on
//   delay CABLE ab|ba DELAY_US JITTER_US   its delay and jitter from then on (a kept network
//                                          re-shaped between a sweep's cells)
//   seed SEED                              every generator restarted from SEED, the first draws
//                                          forgotten (the start of a kept network's cell)
//   counters                               every direction's counters so far, as a JSON list
// End of stdin only stops the reading of commands.

#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <sched.h>
#include <sys/prctl.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr size_t kMaxFrame = 65536 + 64;      // a GSO frame plus its virtio-net header
constexpr size_t kQueueLimitBytes = 256u << 20;  // beyond this the line tail-drops
constexpr int64_t kSpinNs = 200000;  // wake this early and spin: an idle (virtual) CPU wakes slowly
constexpr size_t kFirstDraws = 16;    // the delays each direction reports of the first frames it drew for

volatile sig_atomic_t g_stop = 0;

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "gct-delayline: %s: %s\n", what.c_str(), std::strerror(errno));
  std::exit(1);
}

int open_tap(const char* netns_path, const char* name, bool offload) {
  int ns = open(netns_path, O_RDONLY | O_CLOEXEC);
  if (ns < 0 || setns(ns, CLONE_NEWNET) < 0) die(std::string("enter ") + netns_path);
  close(ns);
  int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) die("open /dev/net/tun");
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, name, IFNAMSIZ - 1);
  ifr.ifr_flags = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR;
  if (ioctl(fd, TUNSETIFF, &ifr) < 0) die(std::string("attach tap ") + name);
  unsigned offloads = offload ? (TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_TSO_ECN) : 0;
  if (ioctl(fd, TUNSETOFFLOAD, offloads) < 0) die("TUNSETOFFLOAD");
  return fd;
}

struct Frame {
  int64_t due_ns;
  std::vector<uint8_t> bytes;
};

struct Direction {
  std::string name;
  int from, to;
  int64_t delay_ns, jitter_ns;
  uint32_t loss_ppm;
  std::deque<Frame> queue;
  size_t queued_bytes = 0;
  int64_t last_due = 0;
  uint64_t frames_in = 0, bytes_in = 0, frames_out = 0, bytes_out = 0, lost = 0, overflow = 0;
  std::mt19937_64 rng;
  std::vector<int64_t> first_us;  // the first kFirstDraws delays drawn since seeding, -1 for a loss

  // This direction's generator from ``seed`` and its place ``index`` among all directions.
  void seed(uint64_t seed, uint64_t index) {
    std::seed_seq seq{uint32_t(seed), uint32_t(seed >> 32), uint32_t(index)};
    rng.seed(seq);
    first_us.clear();
  }

  void note(int64_t us) {
    if (first_us.size() < kFirstDraws) first_us.push_back(us);
  }

  void admit(std::vector<uint8_t>&& frame) {
    frames_in++;
    bytes_in += frame.size();
    if (loss_ppm && std::uniform_int_distribution<uint32_t>(0, 999999)(rng) < loss_ppm) {
      lost++;
      note(-1);
      return;
    }
    if (queued_bytes + frame.size() > kQueueLimitBytes) {
      overflow++;
      return;
    }
    int64_t drawn = delay_ns;
    if (jitter_ns) drawn += std::uniform_int_distribution<int64_t>(-jitter_ns, jitter_ns)(rng);
    note(drawn / 1000);
    int64_t due = now_ns() + drawn;
    if (due < last_due) due = last_due;  // jitter never reorders, as on a single path
    last_due = due;
    queued_bytes += frame.size();
    queue.push_back(Frame{due, std::move(frame)});
  }

  void release(int64_t now) {
    while (!queue.empty() && queue.front().due_ns <= now) {
      Frame& f = queue.front();
      ssize_t n = write(to, f.bytes.data(), f.bytes.size());
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;  // retry on next tick
      if (n >= 0) {
        frames_out++;
        bytes_out += f.bytes.size();
      }
      queued_bytes -= f.bytes.size();
      queue.pop_front();
    }
  }
};

int64_t earliest(const std::vector<std::unique_ptr<Direction>>& dirs) {
  int64_t next = INT64_MAX;
  for (const auto& d : dirs)
    if (!d->queue.empty() && d->queue.front().due_ns < next) next = d->queue.front().due_ns;
  return next;
}

void arm(int tfd, int64_t next) {
  itimerspec spec{};
  if (next != INT64_MAX) {
    next -= kSpinNs;
    if (next <= 0) next = 1;
    spec.it_value.tv_sec = next / 1000000000;
    spec.it_value.tv_nsec = next % 1000000000;
  }
  timerfd_settime(tfd, TFD_TIMER_ABSTIME, &spec, nullptr);
}

void on_signal(int) { g_stop = 1; }

std::string counters_json(const Direction& d) {
  char line[512];
  std::snprintf(line, sizeof line,
                "{\"direction\": \"%s\", \"frames_in\": %llu, \"bytes_in\": %llu, \"frames_out\": %llu, "
                "\"bytes_out\": %llu, \"lost\": %llu, \"overflow\": %llu, \"first_delays_us\": [",
                d.name.c_str(), (unsigned long long)d.frames_in, (unsigned long long)d.bytes_in,
                (unsigned long long)d.frames_out, (unsigned long long)d.bytes_out, (unsigned long long)d.lost,
                (unsigned long long)d.overflow);
  std::string out = line;
  for (size_t i = 0; i < d.first_us.size(); i++) out += (i ? ", " : "") + std::to_string(d.first_us[i]);
  return out + "]}";
}

void seed_all(std::vector<std::unique_ptr<Direction>>& dirs, uint64_t seed) {
  for (size_t i = 0; i < dirs.size(); i++) dirs[i]->seed(seed, i);
}

// Applies one command line; returns the reply (one line).
std::string command(const std::string& line, std::vector<std::unique_ptr<Direction>>& dirs) {
  char verb[16] = {0}, dir[8] = {0};
  long cable = -1;
  long long a = -1, b = 0;
  if (line == "counters") {
    std::string out = "[";
    for (size_t i = 0; i < dirs.size(); i++) out += (i ? ", " : "") + counters_json(*dirs[i]);
    return out + "]";
  }
  unsigned long long seed = 0;
  char rest = 0;
  if (std::sscanf(line.c_str(), "seed %llu %c", &seed, &rest) == 1) {
    seed_all(dirs, seed);
    return "ok";
  }
  int got = std::sscanf(line.c_str(), "%15s %ld %7s %lld %lld", verb, &cable, dir, &a, &b);
  bool loss = got == 4 && std::strcmp(verb, "loss") == 0, delay = got == 5 && std::strcmp(verb, "delay") == 0;
  if (!loss && !delay) return "error: expected 'loss CABLE ab|ba PPM', 'delay CABLE ab|ba DELAY_US JITTER_US', 'seed SEED' or "
                 "'counters'";
  bool ab = std::strcmp(dir, "ab") == 0;
  if ((!ab && std::strcmp(dir, "ba") != 0) || cable < 0 || size_t(2 * cable + 1) >= dirs.size())
    return "error: no such cable or direction";
  Direction& d = *dirs[2 * cable + (ab ? 0 : 1)];
  if (loss) {
    if (a < 0 || a > 1000000) return "error: loss outside 0..1000000 ppm";
    d.loss_ppm = uint32_t(a);
  } else {
    if (a < 0 || b < 0) return "error: delay and jitter must be at least 0";
    d.delay_ns = a * 1000;
    d.jitter_ns = b * 1000;
  }
  return "ok";
}

}  // namespace

int main(int argc, char** argv) {
  constexpr int kPerCable = 11;
  if (argc < 2 + kPerCable || (argc - 2) % kPerCable != 0) {
    std::fprintf(stderr, "usage: %s SEED (NETNS_A TAP_A NETNS_B TAP_B AB_DELAY_US AB_JITTER_US AB_LOSS_PPM "
                         "BA_DELAY_US BA_JITTER_US BA_LOSS_PPM OFFLOAD)...\n", argv[0]);
    return 2;
  }
  prctl(PR_SET_TIMERSLACK, 1UL);  // the default 50 us slack would add to every frame's delay
  std::vector<std::unique_ptr<Direction>> dirs;
  std::vector<Direction*> by_fd;
  for (int c = 2; c < argc; c += kPerCable) {
    char** a = argv + c;
    bool offload = std::atoi(a[10]) != 0;
    int fa = open_tap(a[0], a[1], offload);
    int fb = open_tap(a[2], a[3], offload);
    std::string cable = std::string(a[0]).substr(std::string(a[0]).rfind('/') + 1) + "/" + a[1];
    dirs.push_back(std::make_unique<Direction>(Direction{cable + " ab", fa, fb, std::atoll(a[4]) * 1000,
                                                         std::atoll(a[5]) * 1000, uint32_t(std::atol(a[6]))}));
    dirs.push_back(std::make_unique<Direction>(Direction{cable + " ba", fb, fa, std::atoll(a[7]) * 1000,
                                                         std::atoll(a[8]) * 1000, uint32_t(std::atol(a[9]))}));
    int top = std::max(fa, fb);
    if (int(by_fd.size()) <= top) by_fd.resize(top + 1, nullptr);
    by_fd[fa] = dirs[dirs.size() - 2].get();
    by_fd[fb] = dirs[dirs.size() - 1].get();
  }

  seed_all(dirs, std::strtoull(argv[1], nullptr, 10));

  struct sigaction sa{};
  sa.sa_handler = on_signal;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);

  int ep = epoll_create1(EPOLL_CLOEXEC);
  int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  for (const auto& d : dirs) {
    ev.data.fd = d->from;
    epoll_ctl(ep, EPOLL_CTL_ADD, d->from, &ev);
  }
  ev.data.fd = tfd;
  epoll_ctl(ep, EPOLL_CTL_ADD, tfd, &ev);
  fcntl(0, F_SETFL, fcntl(0, F_GETFL) | O_NONBLOCK);
  ev.data.fd = 0;
  bool commands = epoll_ctl(ep, EPOLL_CTL_ADD, 0, &ev) == 0;  // not for /dev/null, which epoll refuses
  std::string pending;
  std::printf("ready\n");
  std::fflush(stdout);

  std::vector<uint8_t> buf(kMaxFrame);
  std::vector<epoll_event> events(dirs.size() + 2);
  bool busy = false;  // just wrote frames: the kernel may have bridged them to another of our TAPs
  while (!g_stop) {
    int n = epoll_wait(ep, events.data(), int(events.size()), busy ? 0 : -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      die("epoll_wait");
    }
    for (int i = 0; i < n; i++) {
      int fd = events[i].data.fd;
      if (fd == tfd) {
        uint64_t expirations;
        while (read(tfd, &expirations, sizeof expirations) > 0) {}
        continue;
      }
      if (fd == 0) {
        char text[256];
        ssize_t got;
        while ((got = read(0, text, sizeof text)) > 0) pending.append(text, size_t(got));
        if (got == 0 && commands) {  // our parent closed the pipe: no more commands
          epoll_ctl(ep, EPOLL_CTL_DEL, 0, nullptr);
          commands = false;
        }
        size_t eol;
        while ((eol = pending.find('\n')) != std::string::npos) {
          std::printf("%s\n", command(pending.substr(0, eol), dirs).c_str());
          std::fflush(stdout);
          pending.erase(0, eol + 1);
        }
        continue;
      }
      Direction& d = *by_fd[fd];
      for (int burst = 0; burst < 64; burst++) {
        ssize_t len = read(fd, buf.data(), buf.size());
        if (len <= 0) break;
        d.admit(std::vector<uint8_t>(buf.begin(), buf.begin() + len));
      }
    }
    int64_t t = now_ns();
    int64_t head = earliest(dirs);
    if (head != INT64_MAX && head > t && head - t <= kSpinNs) {
      while ((t = now_ns()) < head) {}  // the last stretch, spent awake
    }
    uint64_t before = 0, after = 0;
    for (auto& d : dirs) {
      before += d->frames_out;
      d->release(t);
      after += d->frames_out;
    }
    busy = after != before;
    arm(tfd, earliest(dirs));
  }
  for (const auto& d : dirs) std::printf("%s\n", counters_json(*d).c_str());
  return 0;
}
