#ifndef TRAINYARD_WORKER_TRAINER_PROGRAM_CHANNEL_H_
#define TRAINYARD_WORKER_TRAINER_PROGRAM_CHANNEL_H_

// The host's socket: where the program's Python module (trainyard/__init__.py) sends its
// requests. A Unix socket in the task folder (mode 0600: the task's user alone), one JSON object
// per line each way, a reply to every request in order. Internal to program/.

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace trainyard::trainer::program {

// A request of more than this many bytes closes its connection.
inline constexpr size_t kMaxRequestBytes = 1 << 20;
// Connections beyond this many at once are closed as they come.
inline constexpr int kMaxConnections = 64;

class Channel {
 public:
  // Answers one request; called on the connection's own thread, so calls from different
  // connections run at once. An exception or a malformed line gets {"ok": false, "error": ...}.
  using Handler = std::function<nlohmann::json(const nlohmann::json& request)>;

  // Listens on `path` (replaced if it exists) and serves from a thread of its own.
  // UNAVAILABLE when the socket cannot be made.
  static absl::StatusOr<std::unique_ptr<Channel>> Listen(const std::string& path, Handler handler);
  // Stops serving: closes the socket and every connection, joins the threads.
  ~Channel();

 private:
  Channel(int fd, std::string path, Handler handler);
  void Accept();
  void Serve(int fd);

  const int listen_fd_;
  const std::string path_;
  const Handler handler_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<int> connections_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
  std::thread accept_thread_;  // last: it starts in the constructor
};

}  // namespace trainyard::trainer::program

#endif  // TRAINYARD_WORKER_TRAINER_PROGRAM_CHANNEL_H_
