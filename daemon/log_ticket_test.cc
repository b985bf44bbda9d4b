#include "daemon/log_ticket.h"

#include <gtest/gtest.h>

#include <string>

#include "daemon/token.h"

namespace lockstep {
namespace daemon {
namespace {

constexpr char kMethod[] = "AgentService/ReadLogs";

Status Check(const std::string& header, const std::string& key, const std::string& job,
             const std::string& node, int64_t now) {
  return CheckLogTicket(header, true, key, kMethod, job, node, now);
}

// The format daemon/log_ticket.h gives, computed independently (Python's
// hmac module), so a change to it is a change to the documented format.
TEST(LogTicketTest, KeysAndTicketsAreTheDocumentedHmacs) {
  const std::string key = NodeLogKey("store-key", "node-a");
  EXPECT_EQ(key, "c89847fd00f1a52c5ebef8fba6197f5135d20956b9cae2487cd3a29a335cd0c4");
  EXPECT_EQ(MakeLogTicket(key, "j-1", "node-a", 1000),
            "1000:730564ba4d5b349351fcc0c381ae036baafd3d555485eec85201923ce13ced20");
  EXPECT_NE(NodeLogKey("store-key", "node-b"), key);
  EXPECT_NE(NodeLogKey("other-key", "node-a"), key);
}

TEST(LogTicketTest, OpensItsJobOnItsNodeUntilItExpires) {
  const std::string key = NodeLogKey("store-key", "node-a");
  const std::string ticket = "Ticket " + MakeLogTicket(key, "j-1", "node-a", 1000);
  EXPECT_TRUE(Check(ticket, key, "j-1", "node-a", 999).ok());
  EXPECT_TRUE(Check(ticket, key, "j-1", "node-a", 1000).ok());

  Status expired = Check(ticket, key, "j-1", "node-a", 1001);
  EXPECT_EQ(expired.code(), absl::StatusCode::kUnauthenticated) << expired;
  EXPECT_NE(expired.message().find("expired at 1970-01-01T00:16:40Z"), std::string::npos)
      << expired;
  EXPECT_NE(expired.message().find("reads 1970-01-01T00:16:41Z"), std::string::npos) << expired;

  // Another job, another node (whose key differs too), a job whose id
  // extends this one's, another coordinator's key.
  for (const Status& s :
       {Check(ticket, key, "j-2", "node-a", 999),
        Check(ticket, NodeLogKey("store-key", "node-b"), "j-1", "node-b", 999),
        Check(ticket, key, "j-1", "node-b", 999), Check(ticket, key, "j-10", "node-a", 999),
        Check(ticket, NodeLogKey("other-key", "node-a"), "j-1", "node-a", 999)}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  }
  Status other = Check(ticket, key, "j-2", "node-a", 999);
  EXPECT_NE(other.message().find("not one for job \"j-2\" on node node-a"), std::string::npos)
      << other;
  EXPECT_EQ(other.message().find(ticket.substr(7)), std::string::npos) << "echoes the ticket";
}

TEST(LogTicketTest, ALaterExpiryOrAnotherMacIsForgery) {
  const std::string key = NodeLogKey("store-key", "node-a");
  std::string ticket = MakeLogTicket(key, "j-1", "node-a", 1000);
  // The expiry is under the MAC: moving it on makes the ticket a forgery,
  // refused as such even after the real one has expired.
  EXPECT_EQ(Check("Ticket 9" + ticket, key, "j-1", "node-a", 2000).code(),
            absl::StatusCode::kPermissionDenied);
  ticket.back() = ticket.back() == '0' ? '1' : '0';
  EXPECT_EQ(Check("Ticket " + ticket, key, "j-1", "node-a", 999).code(),
            absl::StatusCode::kPermissionDenied);
  // An agent without a key (not registered) opens nothing.
  EXPECT_EQ(Check("Ticket " + MakeLogTicket("", "j-1", "node-a", 1000), "", "j-1", "node-a", 999)
                .code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(LogTicketTest, BearerTokensMissingAndMalformedTicketsAreUnauthenticated) {
  const std::string key = NodeLogKey("store-key", "node-a");
  Status missing = CheckLogTicket("", false, key, kMethod, "j-1", "node-a", 0);
  EXPECT_EQ(missing.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_NE(missing.message().find("Ticket <log ticket>"), std::string::npos) << missing;

  // The admin token itself, or anything sent as a bearer token, is refused
  // as one: agents take tickets only.
  Status bearer = Check("Bearer " + key, key, "j-1", "node-a", 0);
  EXPECT_EQ(bearer.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_NE(bearer.message().find("not bearer tokens"), std::string::npos) << bearer;
  EXPECT_NE(bearer.message().find(kMethod), std::string::npos) << bearer;

  for (const std::string& bad :
       {std::string("Basic x"), std::string("Ticket "), std::string("Ticket nocolon"),
        std::string("Ticket :abc"), std::string("Ticket -5:abc"), std::string("Ticket 1e3:abc"),
        std::string("Ticket 99999999999999999999999:abc")}) {
    Status s = Check(bad, key, "j-1", "node-a", 0);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << bad << ": " << s;
  }
}

}  // namespace
}  // namespace daemon
}  // namespace lockstep
