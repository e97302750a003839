-- needs:
local woken = 0
for i = 1, #ARGV do
  if wake(ARGV[i]) then woken = woken + 1 end
end
return woken
