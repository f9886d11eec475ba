// The parameter-server shard over gRPC on loopback: workers as threads pushing and pulling
// through real sockets, fencing and bad requests with their codes, and a dead or stuck shard
// turning into an error within the timeout.

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <cstdlib>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/trainer/test_files.h"
#include "worker/trainer/ps/client.h"
#include "worker/trainer/ps/server.h"
#include "worker/trainer/ps/wire.h"

namespace trainyard::trainer {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<ParameterShard> MakeShard(int workers, std::vector<torch::Tensor> pieces) {
  ShardConfig config;
  config.generation = 2;
  config.workers = workers;
  config.optimizer.set_name("sgd");
  config.optimizer.set_lr(0.1);
  config.optimizer.set_momentum(0.9);
  config.optimizer.mutable_schedule()->set_name("constant");
  config.total_steps = 10;
  auto shard = ParameterShard::Create(config, std::move(pieces));
  EXPECT_TRUE(shard.ok()) << shard.status();
  return shard.ok() ? std::move(*shard) : nullptr;
}

std::vector<torch::Tensor> Initial() {
  torch::manual_seed(5);
  return {torch::randn({1000}), torch::randn({7, 3}, torch::kFloat64)};
}

// The gradient rank `rank` pushes at `step`: different per rank and step, known to both sides.
std::vector<torch::Tensor> Gradient(int rank, int step) {
  return {torch::full({1000}, 0.1 * (rank + 1) + step),
          torch::full({7, 3}, -0.5 * rank + 0.01 * step, torch::kFloat64)};
}

TEST(PsServiceTest, WorkersTrainThroughTheShardLikeCallsToItDirectly) {
  constexpr int kWorkers = 3, kSteps = 5;
  std::unique_ptr<ParameterShard> served = MakeShard(kWorkers, Initial());
  std::unique_ptr<ParameterShard> direct = MakeShard(kWorkers, Initial());
  auto server = PsServer::Start(served.get(), "127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = absl::StrCat("127.0.0.1:", (*server)->port());

  std::vector<std::thread> workers;
  std::vector<absl::Status> results(kWorkers);
  for (int rank = 0; rank < kWorkers; ++rank) {
    workers.emplace_back([&, rank] {
      PsClient client(address, 0, 2, rank, absl::Seconds(30));
      std::vector<torch::Tensor> pieces = {torch::empty({1000}),
                                           torch::empty({7, 3}, torch::kFloat64)};
      for (int step = 0; step < kSteps; ++step) {
        const bool stop = step == 3 && rank == 2;
        absl::StatusOr<ParameterShard::PullResult> pulled;
        if (rank % 2 == 1) {
          // Odd ranks push and pull in one call of raw frames (PushPull).
          auto exchanged =
              client.PushPull(step, Gradient(rank, step), rank, stop, {}, step + 1, pieces);
          pulled = exchanged.ok() ? absl::StatusOr<ParameterShard::PullResult>(exchanged->pull)
                                  : exchanged.status();
        } else {
          auto pushed = client.Push(step, Gradient(rank, step), rank, stop);
          pulled = pushed.ok() ? client.Pull(step + 1, pieces) : pushed.status();
        }
        if (!pulled.ok()) {
          results[rank] = pulled.status();
          return;
        }
        if (pulled->version != step + 1 || pulled->agreement.stop != (step == 3) ||
            pulled->agreement.loss != 1.0) {
          results[rank] = absl::InternalError(
              absl::StrCat("rank ", rank, " step ", step, ": unexpected version or agreement"));
          return;
        }
      }
    });
  }
  for (std::thread& t : workers) t.join();
  for (const absl::Status& s : results) ASSERT_TRUE(s.ok()) << s;

  for (int step = 0; step < kSteps; ++step) {
    for (int rank = 0; rank < kWorkers; ++rank) {
      ASSERT_TRUE(direct->Push(2, rank, step, Gradient(rank, step)).ok());
    }
  }
  std::vector<torch::Tensor> expected, got;
  ASSERT_TRUE(direct->Pull(2, kSteps, &expected, absl::InfiniteFuture()).ok());
  PsClient client(address, 0, 2, 0, absl::Seconds(30));
  got = {torch::empty({1000}), torch::empty({7, 3}, torch::kFloat64)};
  auto pulled = client.Pull(kSteps, got);
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_EQ(pulled->version, kSteps);
  EXPECT_TRUE(torch::equal(got[0], expected[0]));
  EXPECT_TRUE(torch::equal(got[1], expected[1]));

  // What the shard's metrics count: every push and pull, and their payload bytes (the pieces
  // hold 1000 float32 and 21 float64 values).
  const ShardStats stats = (*server)->Stats();
  EXPECT_EQ(stats.pushes, kWorkers * kSteps);
  EXPECT_EQ(stats.stale_pushes, 0);
  EXPECT_EQ(stats.pulls, kWorkers * kSteps + 1);
  constexpr int64_t kPayload = 1000 * 4 + 21 * 8;
  EXPECT_GE(stats.bytes_received, stats.pushes * kPayload);
  EXPECT_LT(stats.bytes_received, stats.pushes * (kPayload + 256));
  EXPECT_GE(stats.bytes_sent, stats.pulls * kPayload);
  EXPECT_LT(stats.bytes_sent, stats.pulls * (kPayload + 256));
  EXPECT_GE(stats.pull_wait_seconds, 0);
  EXPECT_EQ(stats.version, kSteps);
}

TEST(PsServiceTest, RefusalsKeepTheirCodesAndNameTheShard) {
  std::unique_ptr<ParameterShard> shard = MakeShard(1, Initial());
  auto server = PsServer::Start(shard.get(), "127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = absl::StrCat("127.0.0.1:", (*server)->port());

  // A worker of another attempt.
  PsClient stale(address, 4, 1, 0, absl::Seconds(10));
  auto fenced = stale.Push(0, Gradient(0, 0));
  EXPECT_EQ(fenced.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(fenced.status().message()),
              HasSubstr(absl::StrCat("parameter server 4 at ", address, ": push")));
  // Gradients that do not fit the pieces.
  PsClient client(address, 0, 2, 0, absl::Seconds(10));
  EXPECT_EQ(
      client.Push(0, {torch::zeros({999}), torch::zeros({7, 3}, torch::kFloat64)}).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client.Push(0, {torch::zeros({1000})}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A pull into tensors of the wrong layout is the worker's bug, not the shard's.
  std::vector<torch::Tensor> wrong = {torch::empty({10}), torch::empty({7, 3}, torch::kFloat64)};
  EXPECT_EQ(client.Pull(0, wrong).status().code(), absl::StatusCode::kInternal);
  // The same through PushPull's frames: gradients that do not fit, and a stale attempt.
  std::vector<torch::Tensor> right = {torch::empty({1000}), torch::empty({7, 3}, torch::kFloat64)};
  auto framed = client.PushPull(0, {torch::zeros({999}), torch::zeros({7, 3}, torch::kFloat64)}, 0,
                                false, {}, 0, right);
  EXPECT_EQ(framed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(framed.status().message()),
              HasSubstr("push-pull: 4164 bytes of gradients for pieces of 4168"));
  EXPECT_EQ(stale.PushPull(0, Gradient(0, 0), 0, false, {}, 0, right).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(shard->version(), 0);
}

// Table rows over gRPC: rows that are not the shard's, and rows of a table it does not have, are
// refused with the shard's own words; good ones come back as the shard holds them.
TEST(PsServiceTest, TableRowsTravelAndBadOnesAreRefused) {
  ShardConfig config;
  config.generation = 2;
  config.shard = 0;
  config.shards = 2;
  config.optimizer.set_name("sgd");
  config.optimizer.set_lr(1.0);
  config.total_steps = 10;
  // Rows 0, 2, 4 of a 5-row table of 2 float64 values.
  const torch::Tensor rows = torch::arange(6, torch::kFloat64).reshape({3, 2});
  auto shard = ParameterShard::Create(config, {}, {}, {rows}, {5});
  ASSERT_TRUE(shard.ok()) << shard.status();
  auto server = PsServer::Start(shard->get(), "127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  PsClient client(absl::StrCat("127.0.0.1:", (*server)->port()), 0, 2, 0, absl::Seconds(10));
  const torch::Tensor ids = torch::tensor({4, 0}, torch::kInt64);
  auto bad = client.Push(
      0, {}, 0, false,
      {RowGradients{torch::tensor({3}, torch::kInt64), torch::ones({1, 2}, torch::kFloat64)}});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("row 3 is not held by shard 0 of 2"));
  bad = client.Push(0, {}, 0, false,
                    {RowGradients{}, RowGradients{ids, torch::ones({2, 2}, torch::kFloat64)}});
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("rows of table 1; the shard has 1"));
  ASSERT_TRUE(
      client.Push(0, {}, 0, false, {RowGradients{ids, torch::ones({2, 2}, torch::kFloat64)}}).ok());
  std::vector<torch::Tensor> out = {torch::empty({2, 2}, torch::kFloat64)};
  auto pulled = client.PullRows(1, {ids}, out);
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_EQ(pulled->version, 1);
  // Rows 4 and 0 (local 2 and 0), each less the learning rate times the gradient 1.
  EXPECT_TRUE(torch::equal(out[0], torch::tensor({{3.0, 4.0}, {-1.0, 0.0}}, torch::kFloat64)));
  EXPECT_EQ(client.PullRows(1, {torch::tensor({1}, torch::kInt64)}, out).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A shard started with its attempt's secret answers only callers that present it: a stranger
// who reaches the port can neither push, pull, read the state nor finish.
TEST(PsServiceTest, OnlyCallersWithTheAttemptsSecretAreServed) {
  std::unique_ptr<ParameterShard> shard = MakeShard(1, Initial());
  auto server = PsServer::Start(shard.get(), "127.0.0.1:0", "s3cret");
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = absl::StrCat("127.0.0.1:", (*server)->port());
  std::vector<torch::Tensor> pieces = {torch::empty({1000}), torch::empty({7, 3}, torch::kFloat64)};
  for (const std::string secret : {"", "guess"}) {
    PsClient stranger(address, 0, 2, 0, absl::Seconds(10), secret);
    EXPECT_EQ(stranger.Push(0, Gradient(0, 0)).status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(stranger.Pull(0, pieces).status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(stranger.PushPull(0, Gradient(0, 0), 1.0, false, {}, 1, pieces).status().code(),
              absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(stranger.Finish().code(), absl::StatusCode::kUnauthenticated);
  }
  // Nothing a stranger sent reached the shard: the rank's own push is the first.
  PsClient rank(address, 0, 2, 0, absl::Seconds(10), "s3cret");
  auto pushed = rank.PushPull(0, Gradient(0, 0), 1.0, false, {}, 1, pieces);
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_EQ((*server)->Stats().pushes, 1);
}

TEST(PsServiceTest, AStuckOrDeadShardIsAnErrorWithinTheTimeout) {
  std::unique_ptr<ParameterShard> shard = MakeShard(2, Initial());
  auto server = PsServer::Start(shard.get(), "127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = absl::StrCat("127.0.0.1:", (*server)->port());
  std::vector<torch::Tensor> pieces = {torch::empty({1000}), torch::empty({7, 3}, torch::kFloat64)};

  // Rank 1 never pushes: rank 0's pull of the next version ends at the timeout.
  PsClient client(address, 0, 2, 0, absl::Milliseconds(300));
  ASSERT_TRUE(client.Push(0, Gradient(0, 0)).ok());
  const absl::Time start = absl::Now();
  auto waited = client.Pull(1, pieces);
  EXPECT_EQ(waited.status().code(), absl::StatusCode::kDeadlineExceeded) << waited.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  // The same through PushPull: rank 0 of version 1 waits for version 2, which never comes.
  PsClient other(address, 0, 2, 1, absl::Milliseconds(300));
  ASSERT_TRUE(other.Push(0, Gradient(1, 0)).ok());
  const absl::Time framed_start = absl::Now();
  auto framed = client.PushPull(1, Gradient(0, 1), 0, false, {}, 2, pieces);
  EXPECT_EQ(framed.status().code(), absl::StatusCode::kDeadlineExceeded) << framed.status();
  EXPECT_LT(absl::Now() - framed_start, absl::Seconds(5));

  // The shard goes away: calls fail, they do not hang.
  server->reset();
  const absl::Time gone = absl::Now();
  auto dead = client.Pull(0, pieces);
  EXPECT_FALSE(dead.ok());
  EXPECT_THAT(dead.status().code(), ::testing::AnyOf(absl::StatusCode::kUnavailable,
                                                     absl::StatusCode::kDeadlineExceeded));
  auto dead_framed = client.PushPull(2, Gradient(0, 2), 0, false, {}, 3, pieces);
  EXPECT_THAT(dead_framed.status().code(), ::testing::AnyOf(absl::StatusCode::kUnavailable,
                                                            absl::StatusCode::kDeadlineExceeded));
  EXPECT_LT(absl::Now() - gone, absl::Seconds(5));
}

// One call of `method` with `body` as its message, bytes as they are (not necessarily a message
// that parses), presenting `secret` unless it is empty.
grpc::Status RawCall(const std::string& address, const std::string& method, const std::string& body,
                     const std::string& secret) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(-1);
  auto channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
  if (!secret.empty()) context.AddMetadata("authorization", "Bearer " + secret);
  grpc::Slice slice(body);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&context, method, grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
    status = std::move(s);
    done.Notify();
  });
  done.WaitForNotification();
  return status;
}

// A stranger's message is refused from its call's metadata, before the shard reads it: bytes
// that would not even parse, near the size the shard accepts, come back UNAUTHENTICATED (not the
// parse's INTERNAL or a handler's INVALID_ARGUMENT), and nothing reached the shard.
TEST(PsServiceTest, AStrangersMessageIsRefusedBeforeItIsRead) {
  std::unique_ptr<ParameterShard> shard = MakeShard(1, Initial());
  auto server = PsServer::Start(shard.get(), "127.0.0.1:0", "s3cret");
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = absl::StrCat("127.0.0.1:", (*server)->port());
  const std::string garbage((*server)->max_message_bytes() - 1024, '\xff');
  for (const std::string& method :
       {std::string("/trainyard.v1.ParameterServer/Push"),
        std::string("/trainyard.v1.ParameterServer/Init"), std::string(ps_wire::kPushPullMethod)}) {
    for (const std::string secret : {"", "guess"}) {
      const grpc::Status status = RawCall(address, method, garbage, secret);
      EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED)
          << method << ": " << status.error_message();
    }
  }
  EXPECT_EQ((*server)->Stats().pushes, 0);
  // The rank's own garbage is read, and refused as what it is.
  EXPECT_EQ(
      RawCall(address, "/trainyard.v1.ParameterServer/Push", "\xff\xff", "s3cret").error_code(),
      grpc::StatusCode::INTERNAL);
}

// The shard accepts messages as large as its parameters need, and no larger: a bigger one is
// refused by gRPC before any handler parses it, whoever sends it. A rank's channel is bounded
// the same way once it knows the shard's share of the partition.
TEST(PsServiceTest, MessagesAreBoundedByWhatTheShardsParametersNeed) {
  std::unique_ptr<ParameterShard> shard = MakeShard(1, Initial());
  auto server = PsServer::Start(shard.get(), "127.0.0.1:0", "s3cret");
  ASSERT_TRUE(server.ok()) << server.status();
  const int64_t parameter_bytes = 1000 * 4 + 21 * 8;
  EXPECT_EQ((*server)->max_message_bytes(), ps_wire::MessageLimit(parameter_bytes, 2));
  EXPECT_LT((*server)->max_message_bytes(), 4 * parameter_bytes + (int64_t{128} << 10));
  const std::string address = absl::StrCat("127.0.0.1:", (*server)->port());
  const std::string oversized((*server)->max_message_bytes() + 1, '\xff');
  const grpc::Status status =
      RawCall(address, "/trainyard.v1.ParameterServer/Push", oversized, "s3cret");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  // What the rank sends and pulls fits.
  PsClient rank(address, 0, 2, 0, absl::Seconds(10), "s3cret");
  rank.LimitMessages(parameter_bytes, 2);
  std::vector<torch::Tensor> pieces = {torch::empty({1000}), torch::empty({7, 3}, torch::kFloat64)};
  auto pushed = rank.PushPull(0, Gradient(0, 0), 1.0, false, {}, 1, pieces);
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  // A rank told the shard holds less refuses the shard's larger answer.
  std::unique_ptr<ParameterShard> big = MakeShard(1, {torch::zeros({200000})});
  auto big_server = PsServer::Start(big.get(), "127.0.0.1:0", "s3cret");
  ASSERT_TRUE(big_server.ok()) << big_server.status();
  PsClient misled(absl::StrCat("127.0.0.1:", (*big_server)->port()), 0, 2, 0, absl::Seconds(10),
                  "s3cret");
  misled.LimitMessages(1000, 1);
  std::vector<torch::Tensor> big_pieces = {torch::empty({200000})};
  EXPECT_EQ(misled.Pull(0, big_pieces).status().code(), absl::StatusCode::kResourceExhausted);
}

// A CA, a certificate for 127.0.0.1 and localhost signed by it, and another CA, made by openssl
// in `dir`.
void MakeCertificates(const std::string& dir) {
  const std::string script = absl::StrCat(
      "set -e; cd '", dir, "'; exec >openssl.log 2>&1\n",
      "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=test-ca -keyout ca.key "
      "-out ca.pem\n",
      "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=other-ca -keyout other.key "
      "-out other-ca.pem\n",
      "openssl req -newkey rsa:2048 -nodes -subj /CN=shard -keyout shard.key -out shard.csr\n",
      "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > shard.ext\n",
      "openssl x509 -req -in shard.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
      "-extfile shard.ext -out shard.pem\n");
  ASSERT_EQ(std::system(script.c_str()), 0) << test_files::ReadFile(dir + "/openssl.log");
}

// With a certificate the shard serves TLS and says so in its address: a rank that trusts its CA
// trains through it; one that trusts another CA, or speaks plaintext, is not served; and the
// secret is still asked for.
TEST(PsServiceTest, OverTlsOnlyRanksThatTrustItsCaReachTheShard) {
  const std::string dir = test_files::MakeTempDir();
  MakeCertificates(dir);
  std::unique_ptr<ParameterShard> shard = MakeShard(1, Initial());
  PsServerOptions options;
  options.caller_secret = "s3cret";
  options.tls_cert_file = dir + "/shard.pem";
  options.tls_key_file = dir + "/shard.key";
  auto server = PsServer::Start(shard.get(), "127.0.0.1:0", options);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_TRUE((*server)->tls());
  const std::string address = (*server)->AddressFor("127.0.0.1");
  EXPECT_EQ(address, absl::StrCat("tls:127.0.0.1:", (*server)->port()));
  std::vector<torch::Tensor> pieces = {torch::empty({1000}), torch::empty({7, 3}, torch::kFloat64)};

  PsTls trusting;
  trusting.ca_file = dir + "/ca.pem";
  PsClient rank(address, 0, 2, 0, absl::Seconds(10), "s3cret", trusting);
  auto pushed = rank.PushPull(0, Gradient(0, 0), 1.0, false, {}, 1, pieces);
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  // Through a name the certificate carries, as TRAINYARD_PS_TLS_SERVER_NAME gives it.
  PsTls named = trusting;
  named.server_name = "localhost";
  PsClient by_name(address, 0, 2, 0, absl::Seconds(10), "s3cret", named);
  EXPECT_TRUE(by_name.Pull(1, pieces).ok());

  PsClient stranger(address, 0, 2, 0, absl::Seconds(10), "guess", trusting);
  EXPECT_EQ(stranger.Pull(1, pieces).status().code(), absl::StatusCode::kUnauthenticated);
  PsTls other;
  other.ca_file = dir + "/other-ca.pem";
  PsClient misled(address, 0, 2, 0, absl::Seconds(3), "s3cret", other);
  EXPECT_EQ(misled.Pull(1, pieces).status().code(), absl::StatusCode::kUnavailable);
  const std::string plain_address = absl::StrCat("127.0.0.1:", (*server)->port());
  PsClient plaintext(plain_address, 0, 2, 0, absl::Seconds(3), "s3cret", trusting);
  EXPECT_EQ(plaintext.Pull(1, pieces).status().code(), absl::StatusCode::kUnavailable);
  PsTls unreadable;
  unreadable.ca_file = dir + "/missing.pem";
  PsClient broken(address, 0, 2, 0, absl::Seconds(3), "s3cret", unreadable);
  const absl::Status refused = broken.Pull(1, pieces).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("missing.pem"));
  EXPECT_EQ((*server)->Stats().pushes, 1);

  // Without the certificate's key there is no server.
  PsServerOptions half = options;
  half.tls_key_file.clear();
  EXPECT_EQ(PsServer::Start(shard.get(), "127.0.0.1:0", half).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Found by fuzz_ps_wire under UndefinedBehaviorSanitizer: a layout's dimensions multiplied past
// int64 (signed overflow) on the way to comparing them with the bytes sent.
TEST(PsWireTest, ALayoutOfImpossibleSizeIsRefusedWithoutOverflow) {
  trainyard::v1::PieceLayout layout;
  layout.set_dtype("I64");
  for (int64_t d : {int64_t{945870667060838400}, int64_t{21}, int64_t{3}}) layout.add_shape(d);
  absl::StatusOr<torch::Tensor> t = ps_wire::TensorFrom(layout, std::string(8, '\0'), "piece");
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  layout.clear_shape();
  layout.add_shape(-1);
  EXPECT_EQ(ps_wire::ByteSize({{-1}, torch::kInt64}), -1);
  EXPECT_FALSE(ps_wire::TensorFrom(layout, "", "piece").ok());
  EXPECT_EQ(ps_wire::ByteSize({{2, 3}, torch::kFloat}), 24);
  // An empty dimension makes no bytes, but the others still make strides: these overflow int64,
  // which LibTorch 1.13 read as a symbol and crashed on (fuzz_ps_wire).
  layout.clear_shape();
  for (int64_t d : {int64_t{112}, int64_t{48}, int64_t{70}, int64_t{0}, int64_t{70}, int64_t{757},
                    int64_t{5937649877}, int64_t{21}, int64_t{21}, int64_t{21}, int64_t{0}}) {
    layout.add_shape(d);
  }
  t = ps_wire::TensorFrom(layout, "", "piece");
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ps_wire::ByteSize({{0, int64_t{1} << 62}, torch::kFloat}), -1);
  EXPECT_EQ(ps_wire::ByteSize({{0, 1 << 20}, torch::kFloat}), 0);  // empty, and possible
}

}  // namespace
}  // namespace trainyard::trainer
